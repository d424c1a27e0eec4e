package stripe

// NewWithLogger is New with the logger stripe-go writes to, for tests that
// check the logs hold no secret.
var NewWithLogger = newProvider
