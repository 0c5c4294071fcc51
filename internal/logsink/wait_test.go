package logsink

import "time"

// testWait bounds a wait on a state; testPoll is how often it looks.
const (
	testWait = 10 * time.Second
	testPoll = time.Millisecond
)
