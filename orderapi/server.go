package orderapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/outbox"
)

// Event routing keys and AMQP types of the messages the order API writes.
const (
	RoutingKeyOrderPlaced    = "order.placed"
	TypeOrderPlaced          = "bookstore.order-placed.v1"
	RoutingKeyOrderCancelled = "order.cancelled"
	TypeOrderCancelled       = "bookstore.order-cancelled.v1"
)

// Order statuses, as stored and returned.
const (
	StatusPlaced    = "placed"
	StatusCancelled = "cancelled"
)

// Attribute keys of the Server's log records.
const (
	logKeyErr    = "err"
	logKeyMethod = "method"
	logKeyPath   = "path"
)

// Server is the order API's http.Handler. It is safe for concurrent use and
// holds no goroutines or resources of its own: the caller owns the pool and
// closes it after the HTTP server has shut down. Handlers use the request's
// context, so a client that goes away rolls its transaction back.
type Server struct {
	cfg      Config
	pool     *pgxpool.Pool
	producer *outbox.Producer
	logger   *slog.Logger
	mux      *http.ServeMux
	handler  http.Handler // route, traced
}

var _ http.Handler = (*Server)(nil)

// New returns a Server that stores orders through pool and writes their
// events with producer. The tables must exist (Migrate, outbox.Migrate). A
// nil logger discards. New returns an error when cfg is invalid or pool or
// producer is nil.
func New(cfg Config, pool *pgxpool.Pool, producer *outbox.Producer, logger *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if pool == nil || producer == nil {
		return nil, errors.New("orderapi: New needs a pool and a producer")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, pool: pool, producer: producer, logger: logger, mux: http.NewServeMux()}
	s.mux.HandleFunc("POST /orders", s.placeOrder)
	s.mux.HandleFunc("POST /orders/{id}/cancel", s.cancelOrder)
	s.mux.HandleFunc("GET /orders/{id}", s.getOrder)
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.handler = s.traced(http.HandlerFunc(s.route))
	return s, nil
}

// ServeHTTP serves r (see route), in a server span when the Config has a
// TracerProvider.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// route routes r. Unknown paths (404) and methods (405, with Allow) are
// answered in the API's JSON error form too.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if _, pattern := s.mux.Handler(r); pattern != "" {
		s.mux.ServeHTTP(w, r)
		return
	}
	// No pattern matched: let the mux decide between 404 and 405 (and
	// compute Allow), then answer in JSON.
	rec := &statusRecorder{header: http.Header{}}
	s.mux.ServeHTTP(rec, r)
	if allow := rec.header.Values("Allow"); len(allow) > 0 {
		w.Header()["Allow"] = allow
	}
	switch rec.status {
	case http.StatusMethodNotAllowed:
		writeError(w, rec.status, fmt.Sprintf("method %s is not allowed on %s", r.Method, r.URL.Path))
	case http.StatusNotFound, 0:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such resource: %s", r.URL.Path))
	default:
		writeError(w, rec.status, http.StatusText(rec.status))
	}
}

// statusRecorder keeps the status and headers a handler writes, discarding
// the body.
type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header         { return r.header }
func (r *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *statusRecorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

// Errors a transaction returns to roll back and choose the answer.
var (
	errOrderNotFound    = errors.New("order not found")
	errAlreadyCancelled = errors.New("order is already cancelled")
)

type placedResponse struct {
	ID    string `json:"id"`
	Total string `json:"total"`
}

type orderPlacedEvent struct {
	OrderID    string       `json:"orderId"`
	CustomerID string       `json:"customerId"`
	Currency   string       `json:"currency"`
	Total      string       `json:"total"`
	PlacedAt   string       `json:"placedAt"`
	Items      []itemOutput `json:"items"`
}

type itemOutput struct {
	BookID    string `json:"bookId"`
	Quantity  int    `json:"quantity"`
	UnitPrice string `json:"unitPrice"`
}

func (s *Server) placeOrder(w http.ResponseWriter, r *http.Request) {
	o, key, rerr := s.readPlaceRequest(w, r)
	if rerr != nil {
		writeError(w, rerr.status, rerr.msg)
		return
	}
	id, err := uuid.NewV7()
	if err != nil {
		s.internalError(w, r, fmt.Errorf("new order id: %w", err))
		return
	}
	if key == "" {
		err = s.insertOrder(r.Context(), s.pool, id, o)
	} else {
		err = pgx.BeginFunc(r.Context(), s.pool, func(tx pgx.Tx) error {
			if err := s.claimKey(r.Context(), tx, key, o.fingerprint(), id); err != nil {
				return err
			}
			return s.insertOrder(r.Context(), tx, id, o)
		})
	}
	var taken *keyTaken
	switch {
	case errors.As(err, &taken):
		replay(w, taken)
	case err != nil:
		s.internalError(w, r, fmt.Errorf("place order %s: %w", id, err))
	default:
		w.Header().Set("Location", "/orders/"+id.String())
		writeJSON(w, http.StatusCreated, placedResponse{ID: id.String(), Total: o.total})
	}
}

// readPlaceRequest checks and decodes a POST /orders request: its
// Idempotency-Key, content type and body.
func (s *Server) readPlaceRequest(w http.ResponseWriter, r *http.Request) (*order, string, *requestError) {
	key, rerr := idempotencyKey(r)
	if rerr != nil {
		return nil, "", rerr
	}
	if rerr := checkJSONContentType(r); rerr != nil {
		return nil, "", rerr
	}
	var req placeRequest
	if rerr := decodeStrict(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), &req); rerr != nil {
		return nil, "", rerr
	}
	o, rerr := req.validate(s.cfg.MaxItems)
	return o, key, rerr
}

// batchSender sends a batch: the pool, or a transaction.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// insertOrder writes order o as id, its items and its OrderPlaced event
// in one round trip: sent on the pool, the batch's statements are one
// implicit transaction (PostgreSQL commits a pipeline's statements at its
// Sync, or rolls them all back when one fails); sent on a transaction,
// they are part of it. The order's placed_at is the API's clock, so that
// the event carries it without a round trip to read it back.
func (s *Server) insertOrder(ctx context.Context, db batchSender, id uuid.UUID, o *order) error {
	n := len(o.items)
	lines, books, quantities, prices := make([]int32, n), make([]uuid.UUID, n), make([]int32, n), make([]string, n)
	placedAt := time.Now().UTC().Truncate(time.Microsecond) // what timestamptz keeps
	event := orderPlacedEvent{
		OrderID:    id.String(),
		CustomerID: o.customerID.String(),
		Currency:   o.currency,
		Total:      o.total,
		PlacedAt:   formatTime(placedAt),
		Items:      make([]itemOutput, n),
	}
	for i, it := range o.items {
		lines[i], books[i], quantities[i], prices[i] = int32(i+1), it.bookID, int32(it.quantity), it.unitPrice
		event.Items[i] = itemOutput{BookID: it.bookID.String(), Quantity: it.quantity, UnitPrice: it.unitPrice}
	}
	payload, err := json.Marshal(event)
	if err != nil {
		return fmt.Errorf("encode OrderPlaced: %w", err)
	}
	b := &pgx.Batch{}
	b.Queue(sqlInsertOrder, id, o.customerID, o.currency, o.total, placedAt)
	b.Queue(sqlInsertItems, id, lines, books, quantities, prices)
	if _, err := s.producer.Queue(ctx, b, outbox.Message{
		CorrelationID: id.String(),
		Exchange:      s.cfg.Exchange,
		RoutingKey:    RoutingKeyOrderPlaced,
		Type:          TypeOrderPlaced,
		Payload:       payload,
	}); err != nil {
		return err
	}
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("insert the order, its %d items and OrderPlaced: %w", n, err)
	}
	return nil
}

type cancelledResponse struct {
	ID          string `json:"id"`
	Status      string `json:"status"`
	CancelledAt string `json:"cancelledAt"`
}

type orderCancelledEvent struct {
	OrderID     string `json:"orderId"`
	CancelledAt string `json:"cancelledAt"`
}

func (s *Server) cancelOrder(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var cancelledAt time.Time
	err := pgx.BeginFunc(r.Context(), s.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(r.Context(), sqlCancelOrder, id).Scan(&cancelledAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return orderStatusError(r.Context(), tx, id)
		}
		if err != nil {
			return fmt.Errorf("update order: %w", err)
		}
		payload, err := json.Marshal(orderCancelledEvent{OrderID: id.String(), CancelledAt: formatTime(cancelledAt)})
		if err != nil {
			return fmt.Errorf("encode OrderCancelled: %w", err)
		}
		_, err = s.producer.Enqueue(r.Context(), tx, outbox.Message{
			CorrelationID: id.String(),
			Exchange:      s.cfg.Exchange,
			RoutingKey:    RoutingKeyOrderCancelled,
			Type:          TypeOrderCancelled,
			Payload:       payload,
		})
		return err
	})
	switch {
	case errors.Is(err, errOrderNotFound):
		writeError(w, http.StatusNotFound, fmt.Sprintf("id: no order %s", id))
	case errors.Is(err, errAlreadyCancelled):
		writeError(w, http.StatusConflict, fmt.Sprintf("id: order %s is already cancelled", id))
	case err != nil:
		s.internalError(w, r, fmt.Errorf("cancel order %s: %w", id, err))
	default:
		writeJSON(w, http.StatusOK, cancelledResponse{ID: id.String(), Status: StatusCancelled, CancelledAt: formatTime(cancelledAt)})
	}
}

// orderStatusError explains why the cancel updated no row.
func orderStatusError(ctx context.Context, tx pgx.Tx, id uuid.UUID) error {
	var status string
	err := tx.QueryRow(ctx, sqlOrderStatus, id).Scan(&status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return errOrderNotFound
	case err != nil:
		return fmt.Errorf("read order status: %w", err)
	case status == StatusCancelled:
		return errAlreadyCancelled
	default:
		return fmt.Errorf("order status is %q, yet the cancel updated nothing", status)
	}
}

type orderResponse struct {
	ID          string       `json:"id"`
	CustomerID  string       `json:"customerId"`
	Currency    string       `json:"currency"`
	Total       string       `json:"total"`
	Status      string       `json:"status"`
	PlacedAt    string       `json:"placedAt"`
	CancelledAt string       `json:"cancelledAt,omitempty"`
	Items       []itemOutput `json:"items"`
}

func (s *Server) getOrder(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	resp, err := s.readOrder(r.Context(), id)
	switch {
	case errors.Is(err, errOrderNotFound):
		writeError(w, http.StatusNotFound, fmt.Sprintf("id: no order %s", id))
	case err != nil:
		s.internalError(w, r, fmt.Errorf("read order %s: %w", id, err))
	default:
		writeJSON(w, http.StatusOK, resp)
	}
}

func (s *Server) readOrder(ctx context.Context, id uuid.UUID) (*orderResponse, error) {
	resp := &orderResponse{ID: id.String(), Items: []itemOutput{}}
	var (
		customerID  uuid.UUID
		placedAt    time.Time
		cancelledAt *time.Time
	)
	err := s.pool.QueryRow(ctx, sqlSelectOrder, id).
		Scan(&customerID, &resp.Currency, &resp.Total, &resp.Status, &placedAt, &cancelledAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errOrderNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("select order: %w", err)
	}
	resp.CustomerID = customerID.String()
	resp.PlacedAt = formatTime(placedAt)
	if cancelledAt != nil {
		resp.CancelledAt = formatTime(*cancelledAt)
	}
	digits, known := MinorDigits(resp.Currency)
	rows, err := s.pool.Query(ctx, sqlSelectItems, id)
	if err != nil {
		return nil, fmt.Errorf("select items: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			it     itemOutput
			bookID uuid.UUID
		)
		if err := rows.Scan(&bookID, &it.Quantity, &it.UnitPrice); err != nil {
			return nil, fmt.Errorf("scan item: %w", err)
		}
		it.BookID = bookID.String()
		if known {
			it.UnitPrice = normalizeAmount(it.UnitPrice, digits)
		}
		resp.Items = append(resp.Items, it)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("select items: %w", err)
	}
	if known {
		resp.Total = normalizeAmount(resp.Total, digits)
	}
	return resp, nil
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		s.logger.WarnContext(r.Context(), "orderapi health check: database unreachable", logKeyErr, err)
		writeError(w, http.StatusServiceUnavailable, "database unreachable")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// pathID reads the {id} path value, answering 400 when it is not a UUID.
func pathID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	raw := r.PathValue("id")
	id, rerr := parseUUID("id", &raw)
	if rerr != nil {
		writeError(w, rerr.status, rerr.msg)
		return uuid.UUID{}, false
	}
	return id, true
}

// internalError logs err and answers 500 without revealing it. A request
// whose client went away is logged as such, not as a failure.
func (s *Server) internalError(w http.ResponseWriter, r *http.Request, err error) {
	level, msg := slog.LevelError, "orderapi request failed"
	if r.Context().Err() != nil && errors.Is(err, context.Canceled) {
		level, msg = slog.LevelInfo, "orderapi request abandoned by the client"
	}
	s.logger.Log(r.Context(), level, msg, logKeyMethod, r.Method, logKeyPath, r.URL.Path, logKeyErr, err)
	writeError(w, http.StatusInternalServerError, "internal error")
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

type errorResponse struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorResponse{Error: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	// A failed write means the client is gone; there is nobody to tell.
	_ = json.NewEncoder(w).Encode(v)
}
