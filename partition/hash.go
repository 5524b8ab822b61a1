package partition

import (
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// DefaultCount is the partition count used when none is configured.
const DefaultCount = 64

// MaxCount is the largest partition count Ordo accepts. The lease table holds
// one row per partition, so the bound keeps that table and /status small.
const MaxCount = 4096

// ErrInvalidCount is returned by ValidateCount for a partition count outside
// 1..MaxCount.
var ErrInvalidCount = errors.New("partition count out of range")

// ValidateCount reports whether p is a usable partition count.
func ValidateCount(p int) error {
	if p < 1 || p > MaxCount {
		return fmt.Errorf("%w: %d (want 1..%d)", ErrInvalidCount, p, MaxCount)
	}
	return nil
}

// Hash returns XXH64 with seed 0 of the UTF-8 bytes of key.
func Hash(key string) uint64 {
	return xxhash.Sum64String(key)
}

// Of returns the partition of key among count partitions: Hash(key) mod count,
// computed on the unsigned 64-bit hash. count must be positive; Of panics
// otherwise, since every caller validates the count at start-up.
func Of(key string, count int) int {
	if count <= 0 {
		panic(fmt.Sprintf("partition.Of: count %d is not positive", count))
	}
	return int(Hash(key) % uint64(count))
}
