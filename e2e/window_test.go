package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestReleaseWindow_PublishedTogetherByPriority: three publishes in a row
// with the same x-delay and priorities 1, 9, 5, through a real proxy and
// RabbitMQ. The proxy takes each at its own instant, a fraction of a
// millisecond apart, so with exact milliseconds their due times differ
// whenever a millisecond boundary falls between them, and the earlier one
// goes first whatever its priority. With --release-window 10ms their due
// times are rounded up to the same multiple of 10 ms whenever they are
// taken within one window, and they come out 9, 5, 1 every time, never
// early.
//
// "Within one window" is measured by the test: each round starts just after
// a window boundary of the wall clock (the proxy's clock is the same), and
// a round counts only if the reply to a passive exchange.declare sent after
// the publishes (the proxy takes publishes in order, before it relays what
// follows) came back before the next boundary. Rounds that straddle one, on
// a busy machine, are repeated.
//
// Without the window, what happens is what the README says: due times are
// exact milliseconds; messages due at the same one go by priority, and so
// do messages of different ones when the scheduler releases them late
// enough that both are due. The subtest checks the first, and logs how many
// rounds came out 9, 5, 1.
func TestReleaseWindow_PublishedTogetherByPriority(t *testing.T) {
	t.Parallel()
	t.Run("window 10ms", func(t *testing.T) {
		t.Parallel()
		testPublishedTogether(t, 10*time.Millisecond)
	})
	t.Run("exact milliseconds", func(t *testing.T) {
		t.Parallel()
		testPublishedTogether(t, 0)
	})
}

func testPublishedTogether(t *testing.T, window time.Duration) {
	const (
		rounds = 30
		delay  = 200 // ms, a multiple of the window
	)
	grid := max(window, time.Millisecond) // the grid due times fall on
	tp := startProxy(t, func(c *delayproxy.Config) { c.ReleaseWindow = window })
	ch := confirmChannel(t, tp.dial(t))
	ex := declareDelayed(t, ch, "direct", nil)
	q := testbroker.DeclareQueue(t, true, nil) // classic, no x-max-priority: arrival order is release order
	bind(t, q, "k", ex, nil)
	cons := consume(t, testbroker.Dial(t, testbroker.URL(t)), q)

	inOrder, conclusive, sameMs := 0, 0, 0
	for attempt := 0; conclusive < rounds; attempt++ {
		if attempt == 10*rounds { // slow machines (-race) straddle often
			t.Fatalf("only %d of %d attempts published within one window", conclusive, attempt)
		}
		// Start just after a boundary of the grid.
		now := time.Now()
		next := now.Truncate(grid).Add(grid + 200*time.Microsecond)
		time.Sleep(time.Until(next))

		before := time.Now()
		var confirms []*amqp.DeferredConfirmation
		for _, prio := range []uint8{1, 9, 5} {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), ex, "k", false, false, amqp.Publishing{
				Headers:   amqp.Table{"x-delay": int32(delay)},
				Priority:  prio,
				MessageId: fmt.Sprintf("%d/%d", attempt, prio),
			})
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			confirms = append(confirms, dc)
		}
		if err := ch.ExchangeDeclarePassive(ex, "x-delayed-message", true, false, false, false, nil); err != nil {
			t.Fatalf("passive declare after the publishes: %v", err)
		}
		after := time.Now()
		for _, dc := range confirms {
			if !dc.Wait() {
				t.Fatalf("attempt %d: publish nacked", attempt)
			}
		}
		pending := tp.listPending(t, ex)
		got := cons.wait(t, 3*(attempt+1), 20*time.Second)[3*attempt:]
		// Released messages stay listed until their store delete.
		testwait.Until(t, 10*time.Second, "the released messages to leave the store", func() bool { return tp.pending(t, ex) == 0 })

		if len(pending) != 3 {
			t.Fatalf("attempt %d: %d pending after the publishes, want 3 (none released before %d ms)", attempt, len(pending), delay)
		}
		dues := map[string]int64{}
		for _, m := range pending {
			dues[m.MessageID] = m.DueMs
			// Never early, and on the grid.
			if exact := ceilMs(before) + delay; m.DueMs < exact {
				t.Errorf("attempt %d: %s due at %d, before publish + x-delay (%d)", attempt, m.MessageID, m.DueMs, exact)
			}
			if m.DueMs%grid.Milliseconds() != 0 {
				t.Errorf("attempt %d: %s due at %d, not a multiple of the %v window", attempt, m.MessageID, m.DueMs, window)
			}
		}
		for _, a := range got {
			if due := time.UnixMilli(dues[a.MessageId]); a.At.Before(due) {
				t.Errorf("attempt %d: %s arrived %v before its due time", attempt, a.MessageId, due.Sub(a.At))
			}
		}
		order := messageIDs(got)
		byPriority := slices.Equal(order, []string{fmt.Sprintf("%d/9", attempt), fmt.Sprintf("%d/5", attempt), fmt.Sprintf("%d/1", attempt)})
		if window == 0 {
			// Equal due times go by priority. Different ones go in due
			// order when the scheduler looks at each millisecond, by
			// priority when it looks late (both are due then).
			conclusive++
			if byPriority {
				inOrder++
			} else {
				t.Logf("attempt %d: arrived %v, dues %v", attempt, order, dues)
			}
			if dues[order[0]] == dues[order[1]] && dues[order[1]] == dues[order[2]] {
				sameMs++
				if !byPriority {
					t.Errorf("attempt %d: arrived %v, all due at %d: want priorities 9, 5, 1", attempt, order, dues[order[0]])
				}
			}
			continue
		}
		if windowIndex(before, window) != windowIndex(after, window) {
			t.Logf("attempt %d: publishing took %v across a window boundary; not counted", attempt, after.Sub(before))
			continue
		}
		conclusive++
		want := windowIndex(before, window)*window.Milliseconds() + delay
		for id, due := range dues {
			if due != want {
				t.Errorf("attempt %d: %s due at %d, want %d like the others published in its window (dues %v)", attempt, id, due, want, dues)
			}
		}
		if byPriority {
			inOrder++
		} else {
			t.Errorf("attempt %d: arrived %v, want priorities 9, 5, 1 (dues %v)", attempt, order, dues)
		}
	}
	if window == 0 {
		t.Logf("exact milliseconds: %d of %d rounds came out 9, 5, 1; in %d the three were due at the same millisecond", inOrder, conclusive, sameMs)
		return
	}
	t.Logf("window %v: %d of %d rounds came out 9, 5, 1", window, inOrder, conclusive)
}

// ceilMs is t in unix milliseconds, rounded up, as the proxy takes the
// publish time.
func ceilMs(t time.Time) int64 {
	ms := t.UnixMilli()
	if t.UnixNano()%int64(time.Millisecond) != 0 {
		ms++
	}
	return ms
}

// windowIndex is the window a publish taken at t falls in: its due time is
// windowIndex × window + x-delay, for an x-delay that is a multiple of the
// window.
func windowIndex(t time.Time, window time.Duration) int64 {
	w := window.Milliseconds()
	return (ceilMs(t) + w - 1) / w
}
