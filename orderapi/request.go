package orderapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"mime"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/google/uuid"
)

// requestError is a client mistake: it becomes a 4xx answer with its
// message and writes nothing.
type requestError struct {
	status int
	msg    string
}

func (e *requestError) Error() string { return e.msg }

func badRequest(format string, args ...any) *requestError {
	return &requestError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// placeRequest is the body of POST /orders as it arrives. Pointers and raw
// values let validation tell missing from wrong and name the field.
type placeRequest struct {
	CustomerID *string       `json:"customerId"`
	Currency   *string       `json:"currency"`
	Items      []itemRequest `json:"items"`
}

type itemRequest struct {
	BookID    *string         `json:"bookId"`
	Quantity  json.RawMessage `json:"quantity"`
	UnitPrice json.RawMessage `json:"unitPrice"`
}

// order is a validated new order.
type order struct {
	customerID uuid.UUID
	currency   string
	digits     int
	items      []item
	total      string // exactly digits fraction digits
}

type item struct {
	bookID    uuid.UUID
	quantity  int
	unitPrice string // exactly digits fraction digits
}

const (
	minQuantity = 1
	maxQuantity = 10000
)

// checkJSONContentType answers whether r declares a JSON body.
func checkJSONContentType(r *http.Request) *requestError {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return &requestError{
			status: http.StatusUnsupportedMediaType,
			msg:    fmt.Sprintf("Content-Type: must be application/json, got %q", truncate(ct)),
		}
	}
	return nil
}

// decodeStrict decodes exactly one JSON value from body into v, whose
// object keys must match v's JSON field names exactly (encoding/json alone
// ignores case): an unknown or differently cased name is a 400 naming it.
func decodeStrict(body io.Reader, v any) *requestError {
	b, err := io.ReadAll(body)
	if err != nil {
		return decodeError(err)
	}
	var generic any
	if rerr := decodeJSON(bytes.NewReader(b), &generic); rerr != nil {
		return rerr
	}
	if rerr := checkFieldNames(generic, reflect.TypeOf(v), ""); rerr != nil {
		return rerr
	}
	return decodeJSON(bytes.NewReader(b), v)
}

// decodeJSON decodes exactly one JSON value from body into v, refusing
// unknown fields and trailing data.
func decodeJSON(body io.Reader, v any) *requestError {
	dec := json.NewDecoder(body)
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	var extra json.RawMessage
	switch err := dec.Decode(&extra); {
	case err == io.EOF:
		return nil
	case err == nil:
		return badRequest("request body: unexpected data after the JSON object")
	default:
		if re := decodeError(err); re.status != http.StatusBadRequest {
			return re
		}
		return badRequest("request body: unexpected data after the JSON object")
	}
}

func decodeError(err error) *requestError {
	var (
		maxErr    *http.MaxBytesError
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &maxErr):
		return &requestError{
			status: http.StatusRequestEntityTooLarge,
			msg:    fmt.Sprintf("request body: larger than the limit of %d bytes", maxErr.Limit),
		}
	case err == io.EOF:
		return badRequest("request body: empty, want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("request body: malformed JSON: unexpected end of input")
	case errors.As(err, &syntaxErr):
		return badRequest("request body: malformed JSON at byte %d: %s", syntaxErr.Offset, strings.TrimPrefix(syntaxErr.Error(), "json: "))
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			field = "request body"
		}
		return badRequest("%s: must be %s, got a JSON %s", field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no typed error for DisallowUnknownFields.
		return badRequest("request body: unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	default:
		return badRequest("request body: %v", err)
	}
}

// jsonKind names a Go kind as the JSON type a client should send.
func jsonKind(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	case "int", "int32", "int64":
		return "an integer"
	default:
		return "a " + kind
	}
}

// validate checks a decoded placeRequest and computes its total.
func (req *placeRequest) validate(maxItems int) (*order, *requestError) {
	o := &order{}
	var err *requestError
	if o.customerID, err = parseUUID("customerId", req.CustomerID); err != nil {
		return nil, err
	}
	if req.Currency == nil {
		return nil, badRequest("currency: is required")
	}
	o.currency = *req.Currency
	if !currencyCode.MatchString(o.currency) {
		return nil, badRequest("currency: must be three upper-case letters (ISO 4217), got %q", truncate(o.currency))
	}
	var ok bool
	if o.digits, ok = MinorDigits(o.currency); !ok {
		return nil, badRequest("currency: %q is not an active ISO 4217 currency", o.currency)
	}
	switch n := len(req.Items); {
	case req.Items == nil:
		return nil, badRequest("items: is required")
	case n == 0:
		return nil, badRequest("items: must hold at least one item")
	case n > maxItems:
		return nil, badRequest("items: holds %d items, the limit is %d", n, maxItems)
	}
	total := new(big.Int)
	limit := maxTotalMinor(o.digits)
	line := new(big.Int)
	o.items = make([]item, len(req.Items))
	for i := range req.Items {
		in, it := &req.Items[i], &o.items[i]
		field := func(name string) string { return fmt.Sprintf("items[%d].%s", i, name) }
		if it.bookID, err = parseUUID(field("bookId"), in.BookID); err != nil {
			return nil, err
		}
		if it.quantity, err = parseQuantity(field("quantity"), in.Quantity); err != nil {
			return nil, err
		}
		price, err := parsePrice(field("unitPrice"), in.UnitPrice, o.currency, o.digits)
		if err != nil {
			return nil, err
		}
		it.unitPrice = formatAmount(price, o.digits)
		total.Add(total, line.Mul(price, big.NewInt(int64(it.quantity))))
		if total.Cmp(limit) > 0 {
			return nil, badRequest("total: exceeds the limit of %d %s (reached at %s)", maxTotalMajor, o.currency, field("unitPrice"))
		}
	}
	o.total = formatAmount(total, o.digits)
	return o, nil
}

// parseUUID reads a required UUID in its canonical 36-character form.
func parseUUID(field string, s *string) (uuid.UUID, *requestError) {
	if s == nil {
		return uuid.UUID{}, badRequest("%s: is required", field)
	}
	id, err := uuid.Parse(*s)
	if err != nil || len(*s) != 36 {
		return uuid.UUID{}, badRequest("%s: %q is not a UUID (want the 36-character form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", field, truncate(*s))
	}
	return id, nil
}

var plainInteger = regexp.MustCompile(`^-?[0-9]+$`)

// parseQuantity reads a required JSON integer between minQuantity and
// maxQuantity.
func parseQuantity(field string, raw json.RawMessage) (int, *requestError) {
	s := string(raw)
	switch {
	case len(raw) == 0 || s == "null":
		return 0, badRequest("%s: is required", field)
	case raw[0] == '"':
		return 0, badRequest("%s: must be a JSON integer, not a string", field)
	case !plainInteger.MatchString(s):
		return 0, badRequest("%s: must be a whole number, got %s", field, truncate(s))
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < minQuantity || n > maxQuantity {
		return 0, badRequest("%s: must be between %d and %d, got %s", field, minQuantity, maxQuantity, truncate(s))
	}
	return n, nil
}

// parsePrice reads a required unit price, a JSON number or string holding a
// plain decimal, as minor units of currency.
func parsePrice(field string, raw json.RawMessage, currency string, digits int) (*big.Int, *requestError) {
	var s string
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, badRequest("%s: is required", field)
	case raw[0] == '"':
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("%s: %v", field, err)
		}
	case raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9'):
		s = string(raw) // a JSON number, exactly as written
	default:
		return nil, badRequest("%s: must be a decimal string or number", field)
	}
	v, err := parseAmount(s, currency, digits)
	if err != nil {
		return nil, badRequest("%s: %v", field, err)
	}
	return v, nil
}
