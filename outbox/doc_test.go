package outbox

import (
	"io/fs"
	"os"
	"strings"
	"testing"
)

// TestDocsHoldExactDDL keeps docs/outbox-table.md exact: it must contain
// every migration verbatim.
func TestDocsHoldExactDDL(t *testing.T) {
	doc, err := os.ReadFile("../docs/outbox-table.md")
	if err != nil {
		t.Fatal(err)
	}
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations: %v", err)
	}
	for _, f := range files {
		b, err := fs.ReadFile(migrations, f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), strings.TrimSpace(string(b))) {
			t.Errorf("docs/outbox-table.md does not hold %s verbatim; paste it in", f)
		}
	}
}
