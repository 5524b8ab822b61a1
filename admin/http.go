package admin

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/google/uuid"
)

// OperatorHeader carries the operator's name with every admin request.
const OperatorHeader = "X-Ordo-Operator"

// Handler serves the operator actions under /admin/:
//
//	GET  /admin/parked[?limit=N]        parked messages
//	POST /admin/messages/{id}/retry     retry one parked message
//	POST /admin/keys/{key}/retry        retry the parked message of a key
//	POST /admin/retry                   bulk retry: {"errorContains": "...", "keyPrefix": "..."}
//	POST /admin/messages/{id}/skip      skip (kill) one parked message
//	POST /admin/purge                   delete purgeable dead rows
//	GET  /admin/gaps[?limit=N]          key_seq gaps (see Gap)
//	POST /admin/keys/{key}/gaps/{keySeq}/fill   put a dead placeholder in a gap
//
// Every request needs "Authorization: Bearer <token>". With an empty token
// the actions are off and every request is answered 403 saying so.
func Handler(store *Store, token string, logger *slog.Logger) http.Handler {
	if logger == nil {
		logger = slog.Default()
	}
	h := &handler{store: store, token: token, logger: logger}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/parked", h.auth(h.parked))
	mux.HandleFunc("POST /admin/messages/{id}/retry", h.auth(h.retry))
	mux.HandleFunc("POST /admin/keys/{key}/retry", h.auth(h.retryKey))
	mux.HandleFunc("POST /admin/retry", h.auth(h.retryBulk))
	mux.HandleFunc("POST /admin/messages/{id}/skip", h.auth(h.skip))
	mux.HandleFunc("POST /admin/purge", h.auth(h.purge))
	mux.HandleFunc("GET /admin/gaps", h.auth(h.gaps))
	mux.HandleFunc("POST /admin/keys/{key}/gaps/{keySeq}/fill", h.auth(h.fillGap))
	mux.HandleFunc("/admin/", h.auth(func(w http.ResponseWriter, r *http.Request, _ Actor) {
		writeErr(w, http.StatusNotFound, "unknown admin action "+r.Method+" "+r.URL.Path)
	}))
	return mux
}

// Guard wraps next with the same bearer-token check as Handler's actions,
// for operator endpoints served elsewhere (the node's gossip keys). next
// receives the caller as an Actor.
func Guard(token string, next func(http.ResponseWriter, *http.Request, Actor)) http.HandlerFunc {
	return (&handler{token: token}).auth(next)
}

// WriteError answers code with the JSON error body every admin endpoint
// uses.
func WriteError(w http.ResponseWriter, code int, msg string) { writeErr(w, code, msg) }

type handler struct {
	store  *Store
	token  string
	logger *slog.Logger
}

func (h *handler) auth(next func(http.ResponseWriter, *http.Request, Actor)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.token == "" {
			writeErr(w, http.StatusForbidden, "admin actions are off: start the node with ORDO_ADMIN_TOKEN set")
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || got == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ordo-admin"`)
			writeErr(w, http.StatusUnauthorized, "missing bearer token (Authorization: Bearer <ORDO_ADMIN_TOKEN>)")
			return
		}
		if subtle.ConstantTimeCompare([]byte(got), []byte(h.token)) != 1 {
			writeErr(w, http.StatusUnauthorized, "wrong admin token")
			return
		}
		op := strings.TrimSpace(r.Header.Get(OperatorHeader))
		if op == "" {
			op = "unknown"
		}
		next(w, r, Actor{Operator: op, RemoteAddr: r.RemoteAddr})
	}
}

// limit reads the ?limit= of a listing (default 100), answering 400 when
// it is not an integer from 1 to 10000.
func limit(w http.ResponseWriter, r *http.Request) (int, bool) {
	s := r.URL.Query().Get("limit")
	if s == "" {
		return 100, true
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 10000 {
		writeErr(w, http.StatusBadRequest, "limit must be an integer from 1 to 10000")
		return 0, false
	}
	return n, true
}

func (h *handler) gaps(w http.ResponseWriter, r *http.Request, _ Actor) {
	n, ok := limit(w, r)
	if !ok {
		return
	}
	list, err := h.store.ListGaps(r.Context(), n)
	if err != nil {
		h.fail(w, err)
		return
	}
	if list == nil {
		list = []Gap{}
	}
	writeJSON(w, http.StatusOK, list)
}

func (h *handler) fillGap(w http.ResponseWriter, r *http.Request, who Actor) {
	key := r.PathValue("key")
	seq, err := strconv.ParseInt(r.PathValue("keySeq"), 10, 64)
	if err != nil || seq < 1 {
		writeErr(w, http.StatusBadRequest, "malformed key_seq "+strconv.Quote(r.PathValue("keySeq"))+": want a positive integer")
		return
	}
	id, err := h.store.FillGap(r.Context(), who, key, seq)
	h.done(w, err, map[string]any{"key": key, "keySeq": seq, "placeholder": id})
}

func (h *handler) parked(w http.ResponseWriter, r *http.Request, _ Actor) {
	limit, ok := limit(w, r)
	if !ok {
		return
	}
	list, err := h.store.ListParked(r.Context(), limit)
	if err != nil {
		h.fail(w, err)
		return
	}
	if list == nil {
		list = []Parked{}
	}
	writeJSON(w, http.StatusOK, list)
}

func (h *handler) messageID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		writeErr(w, http.StatusBadRequest, "malformed message id "+strconv.Quote(r.PathValue("id"))+": want a UUID")
		return uuid.UUID{}, false
	}
	return id, true
}

func (h *handler) retry(w http.ResponseWriter, r *http.Request, who Actor) {
	if id, ok := h.messageID(w, r); ok {
		h.done(w, h.store.Retry(r.Context(), who, id), map[string]any{"retried": id})
	}
}

func (h *handler) retryKey(w http.ResponseWriter, r *http.Request, who Actor) {
	key := r.PathValue("key")
	n, err := h.store.RetryKey(r.Context(), who, key)
	h.done(w, err, map[string]any{"key": key, "retried": n})
}

func (h *handler) skip(w http.ResponseWriter, r *http.Request, who Actor) {
	if id, ok := h.messageID(w, r); ok {
		h.done(w, h.store.Skip(r.Context(), who, id), map[string]any{"skipped": id})
	}
}

func (h *handler) purge(w http.ResponseWriter, r *http.Request, who Actor) {
	n, err := h.store.Purge(r.Context(), who)
	h.done(w, err, map[string]any{"purged": n})
}

func (h *handler) done(w http.ResponseWriter, err error, ok any) {
	if err != nil {
		h.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, ok)
}

func (h *handler) fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrNotFound):
		writeErr(w, http.StatusNotFound, err.Error())
	case errors.Is(err, ErrNotParked):
		writeErr(w, http.StatusConflict, err.Error()+": only parked messages can be retried or skipped")
	case errors.Is(err, ErrNoGap):
		writeErr(w, http.StatusConflict, err.Error())
	case errors.Is(err, ErrNotSupported):
		writeErr(w, http.StatusNotImplemented, err.Error())
	case errors.Is(err, ErrOutcomeUnknown):
		h.logger.Error("admin action", "err", err)
		writeErr(w, http.StatusServiceUnavailable, ErrOutcomeUnknown.Error()+
			": it may have taken effect; check the message or the operator audit before asking again")
	default:
		h.logger.Error("admin action", "err", err)
		writeErr(w, http.StatusInternalServerError, "internal error")
	}
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
