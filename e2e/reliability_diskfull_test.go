package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// mountTmpfs mounts a tmpfs of the given size (mount's syntax: "4m") on a
// fresh directory and unmounts it in t.Cleanup, after every cleanup
// registered later (a proxy using it is stopped and its store checked
// first). It fails the test, never skips, when mounting is not allowed.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size="+size+",mode=0700"); err != nil {
		t.Fatalf("mount -t tmpfs -o size=%s tmpfs %s: %v: the disk-full test needs root or CAP_SYS_ADMIN (CI runs as root)", size, dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("umount %s: %v", dir, err)
			syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	})
	return dir
}

// fillTo writes a file of zeros on dir's file system until at most free
// bytes are left there, and returns its path.
func fillTo(t *testing.T, dir string, free int64) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		left := int64(st.Bavail) * st.Bsize
		if left <= free {
			return path
		}
		if _, err := f.Write(buf[:min(int64(len(buf)), left-free)]); err != nil {
			t.Fatalf("fill %s: %v", path, err)
		}
	}
}

// TestReliabilityDiskFull: the proxy's data dir is on a 4 MiB tmpfs that
// fills up. Delayed publishes are then refused, never dropped: basic.nack
// in confirm mode, the channel closed with 506 RESOURCE_ERROR without;
// plain traffic still flows. When space returns (a filler file on the same
// tmpfs is deleted) new delayed publishes are confirmed again, and every
// message confirmed before, during or after is delivered.
//
// bbolt on tmpfs: the store maps 1 GiB (InitialMmapSize) without touching
// the file and grows it with a sparse truncate, so a full tmpfs shows as
// ENOSPC from pwrite at commit (store.ErrFull), never as SIGBUS.
func TestReliabilityDiskFull(t *testing.T) {
	t.Parallel()
	mnt := mountTmpfs(t, "4m")
	tp := startProxy(t, func(c *delayproxy.Config) { c.DataDir = filepath.Join(mnt, "data") })
	conn := tp.dial(t)
	ex, q := delayedQueue(t, testbroker.Channel(t, conn), "fanout", "")
	got := consume(t, testbroker.Dial(t, testbroker.URL(t)), q)
	plainQ := testbroker.DeclareQueue(t, true, nil)

	filler := fillTo(t, mnt, 1<<20) // about 1 MiB left for the store to grow
	body := []byte(strings.Repeat("d", 16<<10))
	pub := func(ch *amqp.Channel, id string, delay time.Duration) (bool, error) {
		m := delayedMsg(delay.Milliseconds(), id)
		m.Body = body
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), ex, "", false, false, m)
		if err != nil {
			return false, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), crashtest.AnswerTimeout)
		defer cancel()
		return dc.WaitContext(ctx)
	}

	// Fill: publish until the store refuses. Delays of 1.5-3 s, so some
	// fall due (and are released, and their deletes fail) while the disk
	// is full.
	var ledger crashtest.Ledger
	cch := confirmChannel(t, conn)
	firstNack := -1
	for i := 0; firstNack < 0; i++ {
		if i == 400 { // 6 MiB of bodies: more than the tmpfs holds
			t.Fatalf("400 delayed publishes of 16 KiB confirmed on a 4 MiB tmpfs")
		}
		id := fmt.Sprintf("fill-%d", i)
		// Due 4-5.5 s on: none is released (and deleted, freeing space)
		// before the checks of the full disk below, even on a busy machine.
		ok, err := pub(cch, id, 4*time.Second+time.Duration(i%16)*100*time.Millisecond)
		if err != nil {
			t.Fatalf("publish %s: %v (want ack or nack)", id, err)
		}
		if ok {
			ledger.Confirmed = append(ledger.Confirmed, id)
		} else {
			ledger.Nacked = append(ledger.Nacked, id)
			firstNack = i
		}
	}
	full := time.Now()
	// Still full: refused again, promptly, on the same channel. bbolt may
	// still fit a small commit now and then (pages freed by a failed one),
	// so look for three refusals in a row.
	for i, streak := 0, 0; streak < 3; i++ {
		if i == 50 {
			t.Fatalf("no three refusals in a row in 50 publishes while the disk was full")
		}
		id := fmt.Sprintf("full-%d", i)
		ok, err := pub(cch, id, time.Second)
		switch {
		case err != nil:
			t.Fatalf("publish %s while full: %v (want nack)", id, err)
		case ok:
			ledger.Confirmed = append(ledger.Confirmed, id)
			streak = 0
		default:
			ledger.Nacked = append(ledger.Nacked, id)
			streak++
		}
	}
	// Without confirms the channel is closed with 506 RESOURCE_ERROR (a
	// publish that still fits is stored and delivered: try again).
	nch := testbroker.Channel(t, conn)
	closed := nch.NotifyClose(make(chan *amqp.Error, 1))
	var closeErr *amqp.Error
	for i := 0; closeErr == nil; i++ {
		if i == 20 {
			t.Fatalf("20 publishes without confirms on a full disk, channel never closed")
		}
		m := delayedMsg(int32(1000), fmt.Sprintf("unconfirmed-%d", i))
		m.Body = body
		publish(t, nch, ex, "", m)
		ledger.Unanswered = append(ledger.Unanswered, m.MessageId)
		select {
		case closeErr = <-closed:
		case <-time.After(2 * time.Second):
		}
	}
	if closeErr.Code != amqp.ResourceError {
		t.Errorf("no-confirm channel closed with %v, want 506 RESOURCE_ERROR", closeErr)
	} else {
		t.Logf("no-confirm channel: %v", closeErr)
	}
	// Plain messages still go through, on the same connection.
	pch := confirmChannel(t, conn)
	publishConfirmed(t, pch, "", plainQ, false, amqp.Publishing{Body: []byte("plain while full")})
	if n := queueDepth(t, plainQ); n != 1 {
		t.Errorf("plain queue holds %d messages, want 1", n)
	}
	// Stay full until some early messages have fallen due.
	testwait.Until(t, 10*time.Second, "releases while the disk is full", func() bool { return len(got.snapshot()) > 0 })
	time.Sleep(time.Until(full.Add(5 * time.Second))) // more deletes against a full disk
	refusedMetric := tp.metric(t, `delayproxy_messages_refused_total{reason="store_error"}`)

	// Space returns.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		id := fmt.Sprintf("after-%d", i)
		ok, err := pub(cch, id, 500*time.Millisecond)
		if err != nil || !ok {
			t.Fatalf("publish %s after space returned: ack=%v err=%v", id, ok, err)
		}
		ledger.Confirmed = append(ledger.Confirmed, id)
	}
	awaitLedger(t, got, ledger, 30*time.Second)
	// Messages released while the disk was full may still be on disk:
	// their delete failed. See whether they leave without a restart.
	stuck := int64(-1)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if stuck = tp.pending(t, ex); stuck == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if stuck > 0 {
		t.Logf("%d released messages still pending 5 s after space returned (their deletes failed on the full disk); restarting", stuck)
		tp.restart()
		testwait.Until(t, 30*time.Second, "nothing pending after the restart", func() bool { return tp.pending(t, ex) == 0 })
		awaitLedger(t, got, ledger, 10*time.Second) // and what the restart released again has arrived
		time.Sleep(500 * time.Millisecond)
	}
	tally := crashtest.Count([]crashtest.Ledger{ledger}, messageIDs(got.stop(t)))
	t.Logf("full after %d confirmed; %v; refused metric %v", firstNack, tally, refusedMetric)
	if err := tally.Err(releaseWindow); err != nil {
		t.Error(err)
	}
	if refusedMetric < float64(len(ledger.Nacked)) {
		t.Errorf("messages_refused_total{store_error} = %v, want >= %d", refusedMetric, len(ledger.Nacked))
	}
}
