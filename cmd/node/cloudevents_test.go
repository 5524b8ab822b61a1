package main

import (
	"io"
	"strings"
	"testing"
)

// TestParseConfigCloudEvents: -cloudevents (or ORDO_CLOUDEVENTS) turns the
// CloudEvents mapping on and needs -cloudevents-source, a URI-reference;
// it is off by default.
func TestParseConfigCloudEvents(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	o, err := parseConfig(nil, none, io.Discard)
	if err != nil || o.AMQP.CloudEvents {
		t.Fatalf("defaults: CloudEvents %v, err %v; want off", o.AMQP.CloudEvents, err)
	}
	o, err = parseConfig([]string{"-cloudevents", "-cloudevents-source", "/bookstore/orders"}, none, io.Discard)
	if err != nil || !o.AMQP.CloudEvents || o.AMQP.CloudEventsSource != "/bookstore/orders" {
		t.Fatalf("flags: %+v, %v", o.AMQP, err)
	}
	env := map[string]string{"ORDO_CLOUDEVENTS": "true", "ORDO_CLOUDEVENTS_SOURCE": "urn:orders"}
	o, err = parseConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard)
	if err != nil || !o.AMQP.CloudEvents || o.AMQP.CloudEventsSource != "urn:orders" {
		t.Fatalf("environment: %+v, %v", o.AMQP, err)
	}
	_, err = parseConfig([]string{"-cloudevents"}, none, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-cloudevents-source (ORDO_CLOUDEVENTS_SOURCE)") {
		t.Fatalf("-cloudevents without a source: %v, want a problem naming -cloudevents-source", err)
	}
}
