// Package events prints the JSON lines the Go drivers report to pytest (tests/e2e/conftest.py
// JsonLineReader): one object per line on stdout, every one with an "event" key, and exactly one
// final "done" event. Client libraries log to stderr or to files, never to stdout.
package events

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

var mu sync.Mutex

// Emit prints {"event": name, k1: v1, ...}; keyValues come in pairs.
func Emit(name string, keyValues ...any) {
	if len(keyValues)%2 != 0 {
		panic("events.Emit: keyValues must come in pairs")
	}
	obj := map[string]any{"event": name}
	for i := 0; i < len(keyValues); i += 2 {
		obj[fmt.Sprint(keyValues[i])] = keyValues[i+1]
	}
	line, err := json.Marshal(obj)
	if err != nil {
		line, _ = json.Marshal(map[string]any{"event": "error", "where": "emit " + name, "message": err.Error()})
	}
	mu.Lock()
	defer mu.Unlock()
	os.Stdout.Write(append(line, '\n'))
}

// Error prints an "error" event for err.
func Error(where string, err error) {
	Emit("error", "where", where, "message", err.Error())
}

// Done prints the final "done" event and exits: status 0 when ok, 1 otherwise.
func Done(ok bool, keyValues ...any) {
	Emit("done", append([]any{"ok", ok}, keyValues...)...)
	if ok {
		os.Exit(0)
	}
	os.Exit(1)
}
