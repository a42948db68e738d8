// Package delayed makes exchanges of type x-delayed-message work through the
// proxy, as RabbitMQ's delayed-message-exchange plugin did.
package delayed
