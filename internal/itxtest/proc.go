package itxtest

import (
	"bytes"
	"fmt"
	"os"
)

// ProcessState is the state letter /proc gives pid ('T' once stopped by a signal, 'S' asleep).
func ProcessState(pid int) (byte, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The state follows the command name in parentheses, which may itself hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("/proc/%d/stat: no state in %q", pid, b)
	}
	return b[i+2], nil
}
