module github.com/delayproxy/delayproxy

go 1.26

require (
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/rabbitmq/amqp091-go v1.16.0 // indirect
	go.etcd.io/bbolt v1.5.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
