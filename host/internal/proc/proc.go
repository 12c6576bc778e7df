// Package proc reads Linux's /proc for the host's tests and benchmarks:
// which processes a process started, and how much memory one uses.
package proc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Child returns the pid of a child of parent whose command name starts
// with name, or -1.
func Child(parent int, name string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// "pid (comm) state ppid ...": comm may hold spaces, so split
		// after its closing parenthesis.
		s := string(b)
		end := strings.LastIndexByte(s, ')')
		if end < 0 || !strings.Contains(s[:end], "("+name) {
			continue
		}
		if f := strings.Fields(s[end+1:]); len(f) > 1 && f[1] == strconv.Itoa(parent) {
			return pid
		}
	}
	return -1
}

// RSSMiB returns a process's resident set size in MiB, or -1.
func RSSMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return float64(kb) / 1024
		}
	}
	return -1
}
