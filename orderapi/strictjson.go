package orderapi

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// encoding/json matches object keys to struct fields without regard to
// case, so {"CustomerID": ...} would fill customerId. checkFieldNames holds
// a request to the exact names: it walks the generic decoding of the body
// (maps, slices) alongside the Go type the body is decoded into and
// refuses the first key that is not exactly one of the type's JSON names.

// checkFieldNames reports the first object key in v, the generic decoding
// of a request body, that is not exactly a JSON field name of t at the
// same place. Values of the wrong JSON type are left to the typed decode.
func checkFieldNames(v any, t reflect.Type, path string) *requestError {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		slices.Sort(keys) // the same answer for the same body
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				return unknownField(path, k, fields)
			}
			if err := checkFieldNames(obj[k], ft, joinPath(path, k)); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		arr, ok := v.([]any)
		if !ok || t.Elem().Kind() == reflect.Uint8 { // json.RawMessage, []byte: a leaf
			return nil
		}
		for i, e := range arr {
			if err := checkFieldNames(e, t.Elem(), indexPath(path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func unknownField(path, key string, fields map[string]reflect.Type) *requestError {
	where := path
	if where == "" {
		where = "request body"
	}
	for name := range fields {
		if strings.EqualFold(name, key) {
			return badRequest("%s: unknown field %q (field names are case-sensitive: did you mean %q?)", where, key, name)
		}
	}
	return badRequest("%s: unknown field %q", where, key)
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func indexPath(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

// jsonFieldCache maps a struct type to its exported fields by JSON name.
var jsonFieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// jsonFields returns t's fields by the name encoding/json gives them (the
// json tag's name, else the Go name); fields tagged "-" are left out.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := jsonFieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		m[name] = f.Type
	}
	jsonFieldCache.Store(t, m)
	return m
}
