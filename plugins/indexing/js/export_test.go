package js

// Reruns counts the calls stopped for memory beside others and run again
// alone.
func Reruns() int64 { return reruns.Load() }
