package node

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ordo-relay/ordo/relay/tablesource"
)

// TestAdminChecksTokenBeforeSource: a caller without the admin token
// learns nothing of the node's sources, neither which exist (404) nor
// which are not migrated yet (503), an adopted table's included; with the
// token the answers stay.
func TestAdminChecksTokenBeforeSource(t *testing.T) {
	v := &view{
		cfg: Config{AdminToken: "s3cret"},
		srcs: []*source{
			{name: "default", migrated: make(chan struct{})}, // not migrated yet
			{name: "shop", migrated: make(chan struct{}), table: &tableSource{layout: tablesource.Article()}},
		},
	}
	h := v.adminHandler()
	cases := []struct {
		name   string
		path   string
		token  string
		code   int
		reveal string // text the answer must not (401) or must (with token) contain
	}{
		{"unknown source, no token", "/admin/parked?source=billing", "", http.StatusUnauthorized, "billing"},
		{"unknown source, wrong token", "/admin/parked?source=billing", "nope", http.StatusUnauthorized, "billing"},
		{"not migrated, no token", "/admin/parked", "", http.StatusUnauthorized, "not migrated"},
		{"unknown action, no token", "/admin/whatever?source=billing", "", http.StatusUnauthorized, "billing"},
		{"unknown source, token", "/admin/parked?source=billing", "s3cret", http.StatusNotFound, "no source billing"},
		{"not migrated, token", "/admin/parked", "s3cret", http.StatusServiceUnavailable, "not migrated yet"},
		{"adopted table, no token", "/admin/parked?source=shop", "", http.StatusUnauthorized, "shop"},
		{"adopted table, token", "/admin/parked?source=shop", "s3cret", http.StatusServiceUnavailable, "source shop is not migrated yet"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, tc.path, nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			body := rec.Body.String()
			if rec.Code != tc.code {
				t.Fatalf("GET %s: %d %s, want %d", tc.path, rec.Code, strings.TrimSpace(body), tc.code)
			}
			if leaked := strings.Contains(body, tc.reveal); leaked != (tc.code != http.StatusUnauthorized) {
				t.Errorf("GET %s: body %q; contains %q: %v", tc.path, strings.TrimSpace(body), tc.reveal, leaked)
			}
		})
	}
}
