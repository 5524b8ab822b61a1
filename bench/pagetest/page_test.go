package pagetest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testkit.RemoveBinaries()
	os.Exit(code)
}

// testGossipKey is a 16-byte gossip key for tests ("0123456789abcdef").
const testGossipKey = "MDEyMzQ1Njc4OWFiY2RlZg=="

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

// startCluster starts n gossiping node processes on dbURL with the extra
// ORDO_* variables and returns their names and HTTP addresses. A node whose
// port another test took meanwhile is started again on new ports.
func startCluster(t *testing.T, dbURL string, n int, extra ...string) (names, httpAddrs []string) {
	t.Helper()
	bin := testkit.BuildBinary(t, "github.com/ordo-relay/ordo/cmd/node")
	gossip := make([]string, n)
	for i := range n {
		names = append(names, fmt.Sprintf("n%d", i+1))
		gossip[i] = testkit.FreeAddr(t)
		httpAddrs = append(httpAddrs, testkit.FreeAddr(t))
	}
	for i := range n {
		for attempt := 1; ; attempt++ {
			env := append([]string{
				"ORDO_POSTGRES_URL=" + dbURL,
				"ORDO_AMQP_URL=" + testkit.AMQPURL(),
				"ORDO_NODE_NAME=" + names[i],
				"ORDO_HTTP_ADDR=" + httpAddrs[i],
				"ORDO_GOSSIP_ADDR=" + gossip[i],
				"ORDO_JOIN=" + strings.Join(gossip, ","),
				"ORDO_GOSSIP_KEY=" + testGossipKey,
				"ORDO_REJOIN_INTERVAL=1s",
				"ORDO_POLL_INTERVAL=200ms",
				"ORDO_DB_MAX_CONNS=3",
			}, extra...)
			p := testkit.StartProcess(t, names[i], bin, nil, env)
			err := p.AwaitOutput("node started", 30*time.Second)
			if err == nil {
				break
			}
			if attempt == 3 || !strings.Contains(p.Output(), "address already in use") {
				t.Fatal(err)
			}
			gossip[i], httpAddrs[i] = testkit.FreeAddr(t), testkit.FreeAddr(t)
		}
	}
	return names, httpAddrs
}

// TestClusterPage opens the cluster page of a running three-node cluster
// in headless Chromium: it lists every member and every partition; with
// the admin token typed in, a parked message appears, and after its retry
// button is clicked (its exchange now routes it) it disappears.
func TestClusterPage(t *testing.T) {
	testkit.RequireRabbitMQ(t)
	ob := testkit.NewOutbox(t, 64, 4)
	dbURL, pool := ob.URL, ob.Pool
	lonely := testkit.NewExchange(t) // nothing bound yet: the message is returned, then parked
	id := ob.Enqueue(t, nil, outbox.Message{CorrelationID: "page-key", Exchange: lonely,
		RoutingKey: "page.rk", Type: "t", Payload: json.RawMessage(`{}`)})[0].String()
	names, httpAddrs := startCluster(t, dbURL, 3, "ORDO_ADMIN_TOKEN=page-token", "ORDO_MAX_ATTEMPTS=1",
		"ORDO_RETRY_MIN=10ms", "ORDO_RETRY_MAX=50ms", "ORDO_BACKLOG_INTERVAL=250ms")
	ob.WaitParked(t, 1, 30*time.Second)

	ctx := browser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+httpAddrs[0]+"/")); err != nil {
		t.Fatal(err)
	}
	// The page's own views are the convergence check: every member alive,
	// every partition leased.
	waitJS(t, ctx, "three live members listed", `document.querySelectorAll('#members li.alive').length === 3`)
	for _, name := range names {
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
	if err := pool.QueryRow(testkit.Context(t, 30*time.Second), `SELECT processed_at IS NOT NULL FROM outbox WHERE id = $1`, id).Scan(&processed); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "no partition marked parked", `document.querySelectorAll('#grid .cell.parked').length === 0`)
	t.Logf("message processed by the time the row went: %v", processed)
}
