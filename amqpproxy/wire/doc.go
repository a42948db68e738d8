// Package wire is the AMQP 0-9-1 codec of delayproxy: frames, methods
// (generated from the spec), field tables and content headers.
//
// Invariants: decoders never panic on any input; every length is checked
// against what remains before slicing or allocating; tables the proxy does
// not interpret stay raw bytes and pass byte-exact.
package wire
