package partition

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// vectors are the published test vectors (docs/outbox-table.md). A producer
// in another language should reproduce every row.
var vectors = []struct {
	key  string
	hash uint64
	p64  int
	p7   int
}{
	{"", 0xef46db3751d8e999, 25, 6},
	{"a", 0xd24ec4f1a98c6e5b, 27, 6},
	{"abc", 0x44bc2cf5ad770999, 25, 0},
	{"order-42", 0xb5623ec0a2fa4fce, 14, 0},
	{"0195f3a2-7c1e-7b7a-9d4e-3f2a1b0c9d8e", 0x9146924295d578ef, 47, 1},
	{"sipariş-çğüöı", 0x2dffe8f243de9c22, 34, 5},
	{"注文-12345", 0x3222e581d39fc1e1, 33, 4},
	{"Hello, World!", 0xc49aacf8080fe47f, 63, 5},
}

func TestVectors(t *testing.T) {
	var high, nonASCII bool
	for _, v := range vectors {
		t.Run(v.key, func(t *testing.T) {
			if got := Hash(v.key); got != v.hash {
				t.Errorf("Hash(%q) = %#016x, want %#016x", v.key, got, v.hash)
			}
			if got := refXXH64([]byte(v.key)); got != v.hash {
				t.Errorf("reference XXH64(%q) = %#016x, want %#016x", v.key, got, v.hash)
			}
			if got := Of(v.key, 64); got != v.p64 {
				t.Errorf("Of(%q, 64) = %d, want %d", v.key, got, v.p64)
			}
			if got := Of(v.key, 7); got != v.p7 {
				t.Errorf("Of(%q, 7) = %d, want %d", v.key, got, v.p7)
			}
		})
		high = high || v.hash >= 1<<63
		nonASCII = nonASCII || !isASCII(v.key)
	}
	if !high || !nonASCII {
		t.Fatalf("vectors must include a hash >= 2^63 (%v) and a non-ASCII key (%v)", high, nonASCII)
	}
}

// TestMatchesReference checks the production function against an XXH64
// written here from the specification, over random keys of every length up
// to 255 bytes, ASCII and not.
func TestMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabets := []string{
		"abcdefghijklmnopqrstuvwxyz0123456789-",
		"çğıöşüÇĞİÖŞÜ注文番号éß€😀",
	}
	n := 5000
	if testing.Short() {
		n = 500
	}
	for i := 0; i < n; i++ {
		runes := []rune(alphabets[i%2])
		var b strings.Builder
		maxLen := 1 + rng.IntN(255)
		if i%10 == 0 {
			maxLen = 255
		}
		for {
			r := runes[rng.IntN(len(runes))]
			if b.Len()+utf8.RuneLen(r) > maxLen {
				break
			}
			b.WriteRune(r)
		}
		key := b.String()
		want := refXXH64([]byte(key))
		if got := Hash(key); got != want {
			t.Fatalf("Hash(%q) = %#x, reference %#x", key, got, want)
		}
		for _, p := range []int{1, 7, 64, 4096} {
			if got, want := Of(key, p), int(want%uint64(p)); got != want {
				t.Fatalf("Of(%q, %d) = %d, want %d", key, p, got, want)
			}
		}
	}
}

func TestValidateCount(t *testing.T) {
	for _, c := range []struct {
		p  int
		ok bool
	}{{0, false}, {-1, false}, {1, true}, {64, true}, {MaxCount, true}, {MaxCount + 1, false}} {
		if err := ValidateCount(c.p); (err == nil) != c.ok {
			t.Errorf("ValidateCount(%d) = %v, want ok=%v", c.p, err, c.ok)
		}
	}
}

func BenchmarkOf(b *testing.B) {
	key := "0195f3a2-7c1e-7b7a-9d4e-3f2a1b0c9d8e"
	for b.Loop() {
		_ = Of(key, 64)
	}
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// refXXH64 is XXH64 with seed 0, written from the xxHash specification
// (doc/xxhash_spec.md, "XXH64 algorithm") independently of the library.
func refXXH64(in []byte) uint64 {
	const (
		p1 uint64 = 0x9E3779B185EBCA87
		p2 uint64 = 0xC2B2AE3D27D4EB4F
		p3 uint64 = 0x165667B19E3779F9
		p4 uint64 = 0x85EBCA77C2B2AE63
		p5 uint64 = 0x27D4EB2F165667C5
	)
	round := func(acc, lane uint64) uint64 {
		acc += lane * p2
		acc = bits.RotateLeft64(acc, 31)
		return acc * p1
	}
	merge := func(acc, v uint64) uint64 {
		acc ^= round(0, v)
		return acc*p1 + p4
	}
	var seed uint64
	n := uint64(len(in))
	var acc uint64
	if len(in) >= 32 {
		v1, v2, v3, v4 := seed+p1+p2, seed+p2, seed, seed-p1
		for len(in) >= 32 {
			v1 = round(v1, binary.LittleEndian.Uint64(in[0:]))
			v2 = round(v2, binary.LittleEndian.Uint64(in[8:]))
			v3 = round(v3, binary.LittleEndian.Uint64(in[16:]))
			v4 = round(v4, binary.LittleEndian.Uint64(in[24:]))
			in = in[32:]
		}
		acc = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		acc = merge(acc, v1)
		acc = merge(acc, v2)
		acc = merge(acc, v3)
		acc = merge(acc, v4)
	} else {
		acc = seed + p5
	}
	acc += n
	for len(in) >= 8 {
		acc ^= round(0, binary.LittleEndian.Uint64(in))
		acc = bits.RotateLeft64(acc, 27)*p1 + p4
		in = in[8:]
	}
	if len(in) >= 4 {
		acc ^= uint64(binary.LittleEndian.Uint32(in)) * p1
		acc = bits.RotateLeft64(acc, 23)*p2 + p3
		in = in[4:]
	}
	for _, b := range in {
		acc ^= uint64(b) * p5
		acc = bits.RotateLeft64(acc, 11) * p1
	}
	acc ^= acc >> 33
	acc *= p2
	acc ^= acc >> 29
	acc *= p3
	acc ^= acc >> 32
	return acc
}
