// Package amqpproxy is the AMQP 0-9-1 side of delayproxy: a transparent
// proxy that relays each client connection to its own connection to
// RabbitMQ, frame by frame, and lets an Interceptor take part in chosen
// traffic (the delayed-exchange layer).
package amqpproxy
