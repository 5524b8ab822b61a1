// Package composecheck holds no code, only tests: they check that
// docker-compose.yml and the Dockerfile agree with the binaries they run.
// Every ORDO_* variable compose sets must be a flag of the binary it is set
// for (a misspelt variable is silently ignored at run time, so only a test
// can catch it), and the Dockerfile must build every binary compose starts.
//
// The tests need only the go command, not Docker or the servers.
package composecheck
