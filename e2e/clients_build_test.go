package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// The client programs the suite compiles, once per run of TestClients:
// the Java class (javac) and the rabbitmq-c program (cc -lrabbitmq).

// clientJavaClassPath is the Java client and the logging API it needs, as
// Debian's librabbitmq-client-java installs them.
const clientJavaClassPath = "/usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar"

// clientBuildTimeout bounds one compiler run on a machine other builds
// share.
const clientBuildTimeout = 3 * time.Minute

// clientBuilds are the compiled client programs, or why one is missing.
type clientBuilds struct {
	javaDir  string // holds Checks.class
	javaErr  error
	cProgram string // the rabbitmq-c checks
	cErr     error
}

// buildClients compiles the Java and C programs into t.TempDir(), both at
// once.
func buildClients(t *testing.T) *clientBuilds {
	t.Helper()
	dir := t.TempDir()
	b := &clientBuilds{javaDir: filepath.Join(dir, "java"), cProgram: filepath.Join(dir, "rabbitmq-c-checks")}
	var wg sync.WaitGroup
	wg.Go(func() {
		b.javaErr = buildCommand("javac", "-cp", clientJavaClassPath, "-d", b.javaDir,
			filepath.Join("testdata", "clients", "java", "Checks.java"))
	})
	wg.Go(func() {
		b.cErr = buildCommand("cc", "-std=c11", "-D_DEFAULT_SOURCE", "-Wall", "-O1", "-o", b.cProgram,
			filepath.Join("testdata", "clients", "c", "checks.c"), "-lrabbitmq")
	})
	wg.Wait()
	return b
}

// buildCommand runs a compiler; its error says what the compiler said.
func buildCommand(argv ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), clientBuildTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s (`bash .ci/clients` installs the compilers and libraries): %v\n%s", argv[0], err, out)
	}
	return nil
}

// runJavaClient is the Java client's clientSpec.run: one JVM per broker.
func runJavaClient(t *testing.T, ct *clientTargets, prefix string, b *clientBuilds) clientOutput {
	t.Helper()
	if b.javaErr != nil {
		t.Fatalf("the Java client's checks did not compile: %v", b.javaErr)
	}
	return runClientProgram(t, ct, prefix, []string{"java", "-cp", b.javaDir + ":" + clientJavaClassPath, "Checks"})
}

// runRabbitmqC is rabbitmq-c's clientSpec.run: the compiled program, then
// amqp-tools.
func runRabbitmqC(t *testing.T, ct *clientTargets, prefix string, b *clientBuilds) clientOutput {
	t.Helper()
	if b.cErr != nil {
		t.Fatalf("the rabbitmq-c checks did not compile: %v", b.cErr)
	}
	out := runClientProgram(t, ct, prefix, []string{b.cProgram})
	for k, l := range amqpToolsChecks(t, ct, prefix) {
		out.lines[k] = l
	}
	return out
}
