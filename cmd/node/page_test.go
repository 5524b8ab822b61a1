package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// browser starts headless Chromium (Debian's chromium package) for the
// test and returns a chromedp context; it is closed when the test ends.
// Without chromium the test fails in CI and under scripts/test (which sets
// ORDO_TEST_REQUIRE_CHROMIUM), and is skipped elsewhere.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if testkit.InCI() || os.Getenv("ORDO_TEST_REQUIRE_CHROMIUM") != "" {
			t.Fatal("chromium is not installed (apt-get install -y --no-install-recommends chromium)")
		}
		t.Skip("chromium is not installed; apt-get install -y --no-install-recommends chromium")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1100),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// waitJS waits until the JavaScript expression cond is true in the page.
func waitJS(t *testing.T, ctx context.Context, what, cond string) {
	t.Helper()
	start := time.Now()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(tctx, chromedp.Poll[bool](cond, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		body, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main")))
		t.Fatalf("%s: not within 30 s (%v); the page shows:\n%s", what, err, body)
	}
	t.Logf("%s after %v", what, time.Since(start).Round(time.Millisecond))
}

// TestClusterPage opens the cluster page of a running three-node cluster
// in headless Chromium: it lists every member and every partition; with
// the admin token typed in, a parked message appears, and after its retry
// button is clicked (its exchange now routes it) it disappears.
func TestClusterPage(t *testing.T) {
	f := newFixture(t)
	lonely := testkit.NewExchange(t) // nothing bound yet: the message is returned, then parked
	id := f.enqueueTo(t, lonely, "page-key", "page.rk", 1)[0].String()
	c := newCluster(t, f, 3, "ORDO_ADMIN_TOKEN=page-token", "ORDO_MAX_ATTEMPTS=1",
		"ORDO_RETRY_MIN=10ms", "ORDO_RETRY_MAX=50ms", "ORDO_BACKLOG_INTERVAL=250ms")
	c.waitConverged(t, []int{0, 1, 2}, 30*time.Second)
	waitParked(t, f, 1)

	ctx := browser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+c.http[0]+"/")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "three live members listed", `document.querySelectorAll('#members li.alive').length === 3`)
	for _, name := range c.names {
		waitJS(t, ctx, "member "+name+" listed", fmt.Sprintf(`document.querySelector('#members li[data-member=%q]') !== null`, name))
	}
	waitJS(t, ctx, "all 64 partitions in the grid, each leased", `document.querySelectorAll('#grid .cell').length === 64 && document.querySelectorAll('#grid .cell.free').length === 0`)

	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS("#token"), "page-token"),
		chromedp.Click(chromedp.CSS("#token-form button")),
	); err != nil {
		t.Fatal(err)
	}
	row := fmt.Sprintf(`#parked tr[data-id=%q]`, id)
	waitJS(t, ctx, "the parked message listed", fmt.Sprintf(`document.querySelector('%s') !== null`, row))
	waitJS(t, ctx, "its partition marked parked", `document.querySelectorAll('#grid .cell.parked').length === 1`)
	href, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil || strings.Contains(href, "page-token") {
		t.Fatalf("the page's URL %q holds the token (%v)", href, err)
	}
	if out := os.Getenv("ORDO_PAGE_SCREENSHOT"); out != "" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Make the message routable, then retry it from the page.
	queue := testkit.UniqueName(t, "page")
	testkit.WithChannel(t, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(queue, "#", lonely, false, nil)
	})
	t.Cleanup(func() {
		testkit.WithChannel(t, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(queue, false, false, false); return err })
	})
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(row+` button[data-action="retry"]`))); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the retried message gone from the list", fmt.Sprintf(`document.querySelector('%s') === null && document.querySelector('#action-result').textContent.startsWith('retry')`, row))
	var processed bool
	if err := f.pool.QueryRow(ctx30(t), `SELECT processed_at IS NOT NULL FROM outbox WHERE id = $1`, id).Scan(&processed); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "no partition marked parked", `document.querySelectorAll('#grid .cell.parked').length === 0`)
	t.Logf("message processed by the time the row went: %v", processed)
}
