package produce

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// waitsNote describes the waits of runs: the average number of waiting
// backends per sample, by event, largest first (at most 5).
func waitsNote(runs []produceRun) string {
	total, samples := map[string]int{}, 0
	for _, r := range runs {
		samples += r.waitSamples
		for ev, n := range r.waits {
			total[ev] += n
		}
	}
	if samples == 0 {
		return ""
	}
	evs := slices.SortedFunc(maps.Keys(total), func(a, b string) int { return total[b] - total[a] })
	if len(evs) == 0 {
		return fmt.Sprintf("waits: none in %d samples", samples)
	}
	parts := make([]string, 0, 5)
	for _, ev := range evs[:min(len(evs), 5)] {
		parts = append(parts, fmt.Sprintf("%s %.2f", ev, float64(total[ev])/float64(samples)))
	}
	return fmt.Sprintf("waiting backends per sample (%d samples): %s", samples, strings.Join(parts, ", "))
}
