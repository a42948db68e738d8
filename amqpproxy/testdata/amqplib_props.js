// Connects with amqplib and prints the server properties of connection.start
// as JSON, after amqplib's own suite's check (product is "RabbitMQ").
// Usage: node amqplib_props.js URL
'use strict';
const amqp = require('amqplib/callback_api');

amqp.connect(process.argv[2], (err, conn) => {
  if (err) {
    console.error('connect: ' + err.message);
    process.exit(1);
  }
  const props = conn.connection.serverProperties;
  if (props.product !== 'RabbitMQ') {
    console.error(`product is ${JSON.stringify(props.product)}, amqplib's suite asserts "RabbitMQ"`);
    process.exit(1);
  }
  console.log(JSON.stringify(props));
  conn.close(() => process.exit(0));
});
