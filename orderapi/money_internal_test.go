package orderapi

import (
	"math/big"
	"strings"
	"testing"
)

func TestCurrencyTable(t *testing.T) {
	if n := len(minorDigits); n < 150 {
		t.Errorf("embedded table holds %d currencies, want the full ISO 4217 list (150+)", n)
	}
	for code, want := range map[string]int{
		"EUR": 2, "USD": 2, "GBP": 2, "JPY": 0, "KRW": 0, "ISK": 0, "CLP": 0,
		"KWD": 3, "BHD": 3, "JOD": 3, "OMR": 3, "TND": 3, "IQD": 3, "LYD": 3, "CLF": 4, "UYW": 4,
	} {
		if got, ok := MinorDigits(code); !ok || got != want {
			t.Errorf("MinorDigits(%s) = %d, %v; want %d", code, got, ok, want)
		}
	}
	for _, code := range []string{"XXY", "XXX", "XAU", "XDR", "eur", "EU", ""} {
		if _, ok := MinorDigits(code); ok {
			t.Errorf("MinorDigits(%q) found a currency", code)
		}
	}
}

func TestParseCurrenciesRejectsBadTables(t *testing.T) {
	for name, text := range map[string]string{
		"no header":   "EUR,2\n",
		"lower case":  "code,minor_digits\neur,2\n",
		"bad digits":  "code,minor_digits\nEUR,x\n",
		"five digits": "code,minor_digits\nEUR,5\n",
		"duplicate":   "code,minor_digits\nEUR,2\nEUR,2\n",
		"extra field": "code,minor_digits\nEUR,2,978\n",
	} {
		if _, err := parseCurrencies(text); err == nil {
			t.Errorf("%s: parseCurrencies accepted %q", name, text)
		}
	}
}

func TestParseAmount(t *testing.T) {
	for _, tc := range []struct {
		in     string
		code   string
		digits int
		want   string // minor units, or "" for an error
		errHas string
	}{
		{"12.50", "EUR", 2, "1250", ""},
		{"12.5", "EUR", 2, "1250", ""},
		{"12", "EUR", 2, "1200", ""},
		{"0", "EUR", 2, "0", ""},
		{"000.01", "EUR", 2, "1", ""},
		{"1500", "JPY", 0, "1500", ""},
		{"1.25", "KWD", 3, "1250", ""},
		{"1000000000000", "EUR", 2, "100000000000000", ""},
		{"12.505", "EUR", 2, "", "has 3 decimal places, EUR allows 2"},
		{"1.5", "JPY", 0, "", "has 1 decimal place, JPY allows 0"},
		{"-1", "EUR", 2, "", "negative price"},
		{"-0.5", "EUR", 2, "", "negative price"},
		{"+1", "EUR", 2, "", "not a plain decimal"},
		{"1e3", "EUR", 2, "", "not a plain decimal"},
		{"1E3", "EUR", 2, "", "not a plain decimal"},
		{"0x1A", "EUR", 2, "", "not a plain decimal"},
		{".5", "EUR", 2, "", "not a plain decimal"},
		{"5.", "EUR", 2, "", "not a plain decimal"},
		{"1,5", "EUR", 2, "", "not a plain decimal"},
		{"", "EUR", 2, "", "not a plain decimal"},
		{"１", "EUR", 2, "", "not a plain decimal"},
		{"10000000000000", "EUR", 2, "", "exceeds the limit"},
	} {
		got, err := parseAmount(tc.in, tc.code, tc.digits)
		switch {
		case tc.want == "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)):
			t.Errorf("parseAmount(%q, %s) = %v, %v; want an error with %q", tc.in, tc.code, got, err, tc.errHas)
		case tc.want != "" && (err != nil || got.String() != tc.want):
			t.Errorf("parseAmount(%q, %s) = %v, %v; want %s", tc.in, tc.code, got, err, tc.want)
		}
	}
}

func TestFormatAmount(t *testing.T) {
	for _, tc := range []struct {
		minor  int64
		digits int
		want   string
	}{
		{2500, 2, "25.00"}, {1, 2, "0.01"}, {0, 2, "0.00"}, {1500, 0, "1500"}, {0, 0, "0"},
		{1250, 3, "1.250"}, {5, 3, "0.005"}, {1, 4, "0.0001"}, {-150, 2, "-1.50"},
	} {
		if got := formatAmount(big.NewInt(tc.minor), tc.digits); got != tc.want {
			t.Errorf("formatAmount(%d, %d) = %q, want %q", tc.minor, tc.digits, got, tc.want)
		}
	}
}

func TestNormalizeAmount(t *testing.T) {
	for _, tc := range []struct {
		in     string
		digits int
		want   string
	}{
		{"25.00", 2, "25.00"}, {"25", 2, "25.00"}, {"25.5", 2, "25.50"}, {"1500", 0, "1500"},
		{"1500.00", 0, "1500"}, {"1.25", 3, "1.250"}, {"1.255", 2, "1.255"}, {"NaN", 2, "NaN"},
	} {
		if got := normalizeAmount(tc.in, tc.digits); got != tc.want {
			t.Errorf("normalizeAmount(%q, %d) = %q, want %q", tc.in, tc.digits, got, tc.want)
		}
	}
}
