package orderapi

import (
	_ "embed"
	"encoding/csv"
	"fmt"
	"io"
	"math/big"
	"regexp"
	"strconv"
	"strings"
)

// iso4217CSV lists the active ISO 4217 currencies that have a minor unit:
// code,minor_digits. Fund codes with a minor unit (e.g. CLF, UYW) are
// included; precious metals, SDR and test codes (minor unit "N.A.") are not.
//
//go:embed iso4217.csv
var iso4217CSV string

// minorDigits maps an ISO 4217 code to its minor-unit digits.
var minorDigits = mustParseCurrencies(iso4217CSV)

// MinorDigits returns the ISO 4217 minor-unit digits of currency code (2 for
// EUR, 0 for JPY, 3 for KWD), and false when code is not in the embedded
// table of active currencies. Codes are upper case.
func MinorDigits(code string) (int, bool) {
	d, ok := minorDigits[code]
	return d, ok
}

var currencyCode = regexp.MustCompile(`^[A-Z]{3}$`)

func mustParseCurrencies(text string) map[string]int {
	m, err := parseCurrencies(text)
	if err != nil {
		panic("orderapi: embedded iso4217.csv: " + err.Error())
	}
	return m
}

func parseCurrencies(text string) (map[string]int, error) {
	r := csv.NewReader(strings.NewReader(text))
	r.FieldsPerRecord = 2
	header, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("read header: %w", err)
	}
	if header[0] != "code" || header[1] != "minor_digits" {
		return nil, fmt.Errorf("header is %q, want code,minor_digits", header)
	}
	m := map[string]int{}
	for {
		rec, err := r.Read()
		if err == io.EOF {
			return m, nil
		}
		if err != nil {
			return nil, err
		}
		code := rec[0]
		d, err := strconv.Atoi(rec[1])
		switch {
		case !currencyCode.MatchString(code):
			return nil, fmt.Errorf("code %q is not three upper-case letters", code)
		case err != nil || d < 0 || d > maxMinorDigits:
			return nil, fmt.Errorf("%s: minor digits %q is not an integer between 0 and %d", code, rec[1], maxMinorDigits)
		}
		if _, dup := m[code]; dup {
			return nil, fmt.Errorf("%s is listed twice", code)
		}
		m[code] = d
	}
}

// maxMinorDigits is the largest minor unit in ISO 4217 (CLF and UYW have 4).
const maxMinorDigits = 4

// maxTotalMajor is the largest order total accepted, in major units.
const maxTotalMajor = 1_000_000_000_000

// maxTotalDigits is the number of digits of maxTotalMajor.
const maxTotalDigits = 13

// plainDecimal is the only accepted spelling of an amount.
var plainDecimal = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// amountError says why an amount was refused; the caller prefixes the field.
type amountError string

func (e amountError) Error() string { return string(e) }

// parseAmount reads s, a plain decimal, as an integer number of minor units
// of a currency with digits minor-unit digits.
func parseAmount(s, code string, digits int) (*big.Int, error) {
	if strings.HasPrefix(s, "-") {
		return nil, amountError(fmt.Sprintf("negative price %q", truncate(s)))
	}
	if !plainDecimal.MatchString(s) {
		return nil, amountError(fmt.Sprintf("%q is not a plain decimal (digits with an optional fraction; no sign, exponent, spaces or hexadecimal)", truncate(s)))
	}
	whole, frac, _ := strings.Cut(s, ".")
	if len(frac) > digits {
		places := "places"
		if len(frac) == 1 {
			places = "place"
		}
		return nil, amountError(fmt.Sprintf("has %d decimal %s, %s allows %d", len(frac), places, code, digits))
	}
	whole = strings.TrimLeft(whole, "0")
	if len(whole) > maxTotalDigits {
		// Refuse before converting: the conversion of a huge number costs
		// more than the answer is worth.
		return nil, amountError(fmt.Sprintf("%s exceeds the limit of %d", truncate(s), maxTotalMajor))
	}
	v, ok := new(big.Int).SetString(whole+frac+strings.Repeat("0", digits-len(frac)), 10)
	if !ok {
		// Unreachable after the checks above, unless whole and frac are both empty.
		v = new(big.Int)
	}
	return v, nil
}

// formatAmount writes minor units of a currency with digits minor-unit
// digits as a decimal with exactly digits fraction digits.
func formatAmount(minor *big.Int, digits int) string {
	s := new(big.Int).Abs(minor).String()
	if len(s) <= digits {
		s = strings.Repeat("0", digits-len(s)+1) + s
	}
	if digits > 0 {
		s = s[:len(s)-digits] + "." + s[len(s)-digits:]
	}
	if minor.Sign() < 0 {
		s = "-" + s
	}
	return s
}

// normalizeAmount rewrites a decimal read back from the database with
// exactly digits fraction digits when it can do so without losing digits,
// and returns it unchanged otherwise.
func normalizeAmount(s string, digits int) string {
	if !plainDecimal.MatchString(s) {
		return s
	}
	whole, frac, _ := strings.Cut(s, ".")
	trimmed := strings.TrimRight(frac, "0")
	if len(trimmed) > digits {
		return s
	}
	if digits == 0 {
		return whole
	}
	return whole + "." + trimmed + strings.Repeat("0", digits-len(trimmed))
}

// maxTotalMinor returns maxTotalMajor in minor units.
func maxTotalMinor(digits int) *big.Int {
	v := big.NewInt(maxTotalMajor)
	return v.Mul(v, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(digits)), nil))
}

// truncate shortens s for an error message.
func truncate(s string) string {
	const limit = 40
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "..."
}
