// Command delayproxy runs the AMQP 0-9-1 proxy that gives RabbitMQ durable
// delayed delivery. See `delayproxy --help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/admin"
)

func main() { os.Exit(run(os.Args[1:])) }

// run returns the exit status: 0 done, 1 failure, 2 bad configuration;
// the operator commands (cli.go) have more.
func run(args []string) int {
	if isCLICommand(args) {
		return runCLI(args, cliIO{getenv: os.Getenv, now: time.Now, stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr})
	}
	cmd := ""
	if len(args) > 0 && (args[0] == "version" || args[0] == "healthcheck") {
		cmd, args = args[0], args[1:]
	}
	if cmd == "version" {
		fmt.Println(delayproxy.VersionString())
		return 0
	}
	cfg, err := delayproxy.LoadConfig(args, os.Getenv, os.Stderr)
	switch {
	case errors.Is(err, delayproxy.ErrHelp):
		return 0
	case errors.Is(err, delayproxy.ErrVersion):
		fmt.Println(delayproxy.VersionString())
		return 0
	case err != nil:
		fmt.Fprintf(os.Stderr, "delayproxy: %v\n", err)
		return 2
	}

	if cmd == "healthcheck" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := admin.Probe(ctx, cfg.HTTPAddr, "/healthz"); err != nil {
			fmt.Fprintf(os.Stderr, "delayproxy healthcheck: %v\n", err)
			return 1
		}
		return 0
	}

	logger := cfg.NewLogger(os.Stderr)
	p, err := delayproxy.New(cfg, logger)
	if err != nil {
		logger.Error("cannot start", "err", err)
		return 1
	}

	// The first SIGINT or SIGTERM starts a graceful shutdown; a second one
	// exits at once.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		logger.Info("signal received, shutting down; send it again to exit at once", "signal", s.String())
		cancel()
		s = <-sigs
		logger.Error("second signal, exiting without a graceful shutdown", "signal", s.String())
		os.Exit(1)
	}()

	if err := p.Run(ctx); err != nil {
		logger.Error("delayproxy stopped", "err", err)
		return 1
	}
	return 0
}
