//! Harness for integration tests that start real `ringd` processes.
