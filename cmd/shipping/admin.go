package main

import (
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/wire"
)

// operatorHeader carries the operator's name with every admin request,
// for the audit record (the node's admin API uses the same header).
const operatorHeader = "X-Ordo-Operator"

// adminAPI serves the operator's side of the inbox under /admin/, the
// HTTP twin of the stuck, dead, resolve, retry and skip commands:
//
//	GET  /admin/stuck               keys stuck on a gap past -gap-wait
//	GET  /admin/dead                dead-lettered messages holding their keys
//	POST /admin/keys/{key}/resolve  declare a stuck key's missing messages skipped
//	POST /admin/keys/{key}/retry    give a key's dead-lettered message new attempts
//	POST /admin/keys/{key}/skip     drop a key's dead-lettered message; the key goes on
//	GET  /admin/audit[?limit=N]     the last operator actions, newest first
//
// The key actions take ?source=NAME, the key's source (x-ordo-source),
// "default" when absent; the listings name each key's source.
//
// Every request needs "Authorization: Bearer <token>"; with an empty token
// every request is answered 403. Each action is recorded in
// ordo_inbox_audit (inbox.Act), refused ones included.
type adminAPI struct {
	pool    *pgxpool.Pool
	name    string        // the consumer group
	gapWait time.Duration // what /admin/stuck calls stuck
	token   string
	logger  *slog.Logger
}

// mount adds the admin routes to mux.
func (a *adminAPI) mount(mux *http.ServeMux) {
	mux.HandleFunc("GET /admin/stuck", a.auth(a.stuck))
	mux.HandleFunc("GET /admin/dead", a.auth(a.dead))
	mux.HandleFunc("GET /admin/audit", a.auth(a.audit))
	mux.HandleFunc("POST /admin/keys/{key}/{action}", a.auth(a.act))
	mux.HandleFunc("/admin/", a.auth(func(w http.ResponseWriter, r *http.Request, _ inbox.Actor) {
		writeError(w, http.StatusNotFound, "unknown admin action "+r.Method+" "+r.URL.Path)
	}))
}

// auth checks the bearer token (in constant time) before next runs, and
// hands next the caller.
func (a *adminAPI) auth(next func(http.ResponseWriter, *http.Request, inbox.Actor)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.token == "" {
			writeError(w, http.StatusForbidden, "admin actions are off: start shipping with -admin-token (ORDO_ADMIN_TOKEN) set")
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || got == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ordo-shipping-admin"`)
			writeError(w, http.StatusUnauthorized, "missing bearer token (Authorization: Bearer <ORDO_ADMIN_TOKEN>)")
			return
		}
		if subtle.ConstantTimeCompare([]byte(got), []byte(a.token)) != 1 {
			writeError(w, http.StatusUnauthorized, "wrong admin token")
			return
		}
		op := strings.TrimSpace(r.Header.Get(operatorHeader))
		if op == "" {
			op = "unknown"
		}
		next(w, r, inbox.Actor{Operator: op, RemoteAddr: r.RemoteAddr})
	}
}

func (a *adminAPI) stuck(w http.ResponseWriter, r *http.Request, _ inbox.Actor) {
	keys, err := inbox.Stuck(r.Context(), a.pool, a.name, a.gapWait)
	list(a, w, keys, err)
}

func (a *adminAPI) dead(w http.ResponseWriter, r *http.Request, _ inbox.Actor) {
	ms, err := inbox.Dead(r.Context(), a.pool, a.name)
	list(a, w, ms, err)
}

func (a *adminAPI) audit(w http.ResponseWriter, r *http.Request, _ inbox.Actor) {
	n := 100
	if s := r.URL.Query().Get("limit"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 || n > 10000 {
			writeError(w, http.StatusBadRequest, "limit must be an integer from 1 to 10000")
			return
		}
	}
	entries, err := inbox.Audit(r.Context(), a.pool, a.name, n)
	list(a, w, entries, err)
}

// list answers a listing as a JSON array ([] when empty).
func list[T any](a *adminAPI, w http.ResponseWriter, items []T, err error) {
	if err != nil {
		a.logger.Error("shipping admin listing", "err", err)
		writeError(w, http.StatusInternalServerError, "internal error")
		return
	}
	if items == nil {
		items = []T{}
	}
	writeJSON(w, http.StatusOK, items)
}

func (a *adminAPI) act(w http.ResponseWriter, r *http.Request, who inbox.Actor) {
	action, err := inbox.ParseAction(r.PathValue("action"))
	if err != nil {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	key := r.PathValue("key")
	source := r.URL.Query().Get("source")
	if source == "" {
		source = wire.DefaultSource
	}
	if err := wire.ValidateSource(source); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	err = inbox.Act(r.Context(), a.pool, who, action, a.name, source, key)
	switch {
	case err == nil:
		a.logger.Info("shipping operator action", "action", action, "source", source, "key", key, "operator", who.Operator, "from", who.RemoteAddr)
		writeJSON(w, http.StatusOK, map[string]string{"action": string(action), "source": source, "key": key,
			"result": "done; the owning instance picks it up within its retry poll"})
	case errors.Is(err, inbox.ErrNothingToResolve):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, inbox.ErrOutcomeUnknown):
		a.logger.Error("shipping operator action", "action", action, "source", source, "key", key, "err", err)
		writeError(w, http.StatusServiceUnavailable, inbox.ErrOutcomeUnknown.Error()+
			": it may have taken effect; check the key or the audit before asking again")
	default:
		a.logger.Error("shipping operator action", "action", action, "source", source, "key", key, "err", err)
		writeError(w, http.StatusInternalServerError, "internal error")
	}
}

// writeError answers code with the JSON error body of every admin
// endpoint.
func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
