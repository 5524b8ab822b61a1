package orderapi_test

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkPlaceOrder posts two-item orders through HTTP against a real
// database and reports orders placed per second. Each order is one
// transaction writing the order, its items and one outbox row.
func BenchmarkPlaceOrder(b *testing.B) {
	e := newEnv(b, slog.New(slog.DiscardHandler))
	client := e.ts.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
	body := orderBody("EUR", itemJSON(bookA, "2", `"12.50"`), itemJSON(bookB, "1", `"7.99"`))
	b.SetParallelism(4) // requests in flight per GOMAXPROCS; the pool has 4 connections
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(e.ts.URL+"/orders", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				b.Errorf("POST /orders = %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "orders/s")
	if o, _, m := e.counts(b); o != b.N || m != b.N {
		b.Errorf("%d orders and %d outbox rows after %d POSTs", o, m, b.N)
	}
}
