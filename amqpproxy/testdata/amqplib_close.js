// Publishes and then closes, round after round, with amqplib's callback
// API: every close callback must fire without an error, and the connection
// must emit 'close' without an error and never 'error' (ECONNRESET).
// Usage: node amqplib_close.js URL ROUNDS
'use strict';
const amqp = require('amqplib/callback_api');

const [url, rounds] = [process.argv[2], Number(process.argv[3] || 1)];
const body = Buffer.alloc(4096, 'x');

function round(i) {
  if (i === rounds) {
    console.log(JSON.stringify({ rounds }));
    process.exit(0);
  }
  amqp.connect(url, (err, conn) => {
    if (err) fail(i, 'connect: ' + err.message);
    let closedCb = false;
    conn.on('error', (e) => fail(i, `'error' event: ${e.code || ''} ${e.message}`));
    conn.on('close', (e) => {
      if (e) fail(i, `'close' event with an error: ${e.code || ''} ${e.message}`);
      // The callback runs before or after 'close'; give it a turn.
      setImmediate(() => {
        if (!closedCb) fail(i, 'the close callback never fired');
        round(i + 1);
      });
    });
    conn.createChannel((err, ch) => {
      if (err) fail(i, 'createChannel: ' + err.message);
      for (let n = 0; n < 20; n++) ch.publish('', 'dp-test.amqplib-close.nowhere', body);
      conn.close((err) => {
        if (err) fail(i, `close callback with an error: ${err.code || ''} ${err.message}`);
        closedCb = true;
      });
    });
  });
}

function fail(i, what) {
  console.error(`round ${i}: ${what}`);
  process.exit(1);
}

round(0);
