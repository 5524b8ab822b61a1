package membership

import (
	"bytes"
	"context"
	"log"
	"log/slog"
)

// newLogBridge returns a *log.Logger for memberlist that forwards its lines
// to logger at the level their "[DEBUG]", "[INFO]", "[WARN]" or "[ERR]"
// prefix names.
func newLogBridge(logger *slog.Logger) *log.Logger {
	return log.New(bridge{logger}, "", 0)
}

type bridge struct{ logger *slog.Logger }

func (b bridge) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	level := slog.LevelInfo
	for _, x := range []struct {
		prefix string
		level  slog.Level
	}{{"[DEBUG]", slog.LevelDebug}, {"[INFO]", slog.LevelInfo}, {"[WARN]", slog.LevelWarn}, {"[ERR]", slog.LevelError}} {
		if i := bytes.Index(line, []byte(x.prefix)); i >= 0 {
			level = x.level
			line = bytes.TrimSpace(line[i+len(x.prefix):])
			break
		}
	}
	b.logger.Log(context.Background(), level, "gossip: "+string(line))
	return len(p), nil
}
