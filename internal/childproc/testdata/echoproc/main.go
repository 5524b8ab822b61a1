// Command echoproc is a test helper for testkit's process tests: it prints
// ECHOPROC_STDERR (if set) to stderr, prints its arguments and "ready" to
// stdout, then exits with status 3 on SIGTERM. With the argument "exit7" it
// exits with status 7 right after printing "ready"; with "ignoreterm" it
// ignores SIGTERM and runs until killed.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	if v := os.Getenv("ECHOPROC_STDERR"); v != "" {
		fmt.Fprintln(os.Stderr, v)
	}
	fmt.Println("args:", strings.Join(os.Args[1:], ","))
	fmt.Println("ready")
	if len(os.Args) > 1 && os.Args[1] == "exit7" {
		fmt.Print("no newline at the end")
		os.Exit(7)
	}
	<-sig
	fmt.Println("got SIGTERM")
	if len(os.Args) > 1 && os.Args[1] == "ignoreterm" {
		select {} // until killed
	}
	os.Exit(3)
}
