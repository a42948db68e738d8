<?php
// The e2e client suite's checks with php-amqplib (Debian's php-amqplib):
// one JSON line per check and target, see e2e/clients_test.go.

require 'PhpAmqpLib/autoload.php';

use PhpAmqpLib\Connection\AMQPStreamConnection;
use PhpAmqpLib\Exception\AMQPExceptionInterface;
use PhpAmqpLib\Exception\AMQPTimeoutException;
use PhpAmqpLib\Message\AMQPMessage;
use PhpAmqpLib\Wire\AMQPDecimal;
use PhpAmqpLib\Wire\AMQPTable;

// The delays the suite asks for, in milliseconds (e2e/clients_expect_test.go).
const DELAY_INT = 300;
const DELAY_STRING = '350';
const DELAY_FLOAT = 400.7;
const DELAY_TOPIC = 300;
const DELAY_INT32 = 450;
const DELAY_TX = 300;
const ARRIVAL_TIMEOUT_MS = 20000;
// How many connections close_reopen closes with confirms in flight: a reset
// after close-ok comes in a third to a half of them.
const CLOSE_ROUNDS = 10;

$ADDRS = [
    'direct' => getenv('CLIENT_DIRECT_ADDR'),
    'proxy' => getenv('CLIENT_PROXY_ADDR'),
    'proxy32' => getenv('CLIENT_PROXY32_ADDR'),
];

// Conn shows the channel_max the handshake settled on, which
// php-amqplib keeps to itself.
class Conn extends AMQPStreamConnection
{
    public function negotiatedChannelMax()
    {
        return $this->channel_max;
    }
}

function connect($target, $password = null, $vhost = '/')
{
    global $ADDRS;
    [$host, $port] = explode(':', $ADDRS[$target]);
    return new Conn($host, (int)$port, getenv('CLIENT_USER'), $password ?? getenv('CLIENT_PASSWORD'), $vhost);
}

function name($target, $suffix)
{
    return getenv('CLIENT_PREFIX') . ".$target.$suffix";
}

function emit($check, $target, $result, $error = null)
{
    $line = ['check' => $check, 'target' => $target];
    if ($error !== null) {
        $line['error'] = $error;
    } else {
        $line['result'] = $result;
    }
    echo json_encode($line, JSON_UNESCAPED_SLASHES | JSON_PRESERVE_ZERO_FRACTION), "\n";
}

function run($check, $target, callable $fn)
{
    try {
        emit($check, $target, $fn());
    } catch (Throwable $e) {
        emit($check, $target, null, get_class($e) . ': ' . $e->getMessage() . "\n" . $e->getTraceAsString());
    }
}

function now_ms()
{
    return hrtime(true) / 1e6;
}

// refusal runs $fn, which must end in a refusal, and returns its code and text.
function refusal(callable $fn)
{
    try {
        $fn();
    } catch (AMQPExceptionInterface $e) {
        // php-amqplib appends the (class, method) ids to the reply text.
        return ['code' => $e->getCode() ?: null, 'text' => preg_replace('/\(\d+, \d+\)$/', '', $e->getMessage())];
    }
    return ['code' => null, 'text' => 'not refused'];
}

function headers_of(AMQPMessage $m)
{
    return $m->has('application_headers') ? $m->get('application_headers')->getNativeData() : null;
}

// x-delay as php-amqplib decoded it: its text and PHP type.
function x_delay($headers)
{
    if ($headers === null || !array_key_exists('x-delay', $headers)) {
        return [null, null];
    }
    $v = $headers['x-delay'];
    return [(string)$v, gettype($v)];
}

function msg($body, $headers = null, $props = [])
{
    if ($headers !== null) {
        $props['application_headers'] = $headers;
    }
    return new AMQPMessage($body, $props);
}

function server($target)
{
    $c = connect($target);
    $p = $c->getServerProperties();
    $r = ['product' => $p['product'][1], 'version' => $p['version'][1], 'channel_max' => $c->negotiatedChannelMax()];
    $c->close();
    return $r;
}

// poll takes messages from $queue with basic.get until every message-id of
// $want arrived, and 300 ms more: message-id => [arrival ms, headers].
function poll($ch, $queue, array $want)
{
    $got = [];
    $deadline = now_ms() + ARRIVAL_TIMEOUT_MS;
    $quietUntil = null;
    while (now_ms() < $deadline) {
        $m = $ch->basic_get($queue, true);
        if ($m !== null) {
            $got[$m->get('message_id')] = [now_ms(), headers_of($m)];
            continue;
        }
        if (!array_diff($want, array_keys($got))) {
            if ($quietUntil === null) {
                $quietUntil = now_ms() + 300;
            } elseif (now_ms() >= $quietUntil) {
                break;
            }
        }
        usleep(10000);
    }
    return $got;
}

function declare_delayed($ch, $target, $suffix, $type)
{
    $ch->exchange_declare(name($target, $suffix), 'x-delayed-message', false, true, false, false, false,
        new AMQPTable(['x-delayed-type' => $type]));
}

function delayed($target, array $cases, $emitDeclare)
{
    $c = connect($target);
    $ch = $c->channel();
    $decl = [];
    foreach (['direct' => 'dx', 'topic' => 'dt'] as $type => $suffix) {
        try {
            declare_delayed($ch, $target, $suffix, $type);
            $decl[$type] = 'ok';
        } catch (AMQPExceptionInterface $e) {
            $decl[$type] = $e->getMessage();
            $ch = $c->channel();
        }
    }
    if ($emitDeclare) {
        emit('declare', $target, $decl);
    }
    $ch->confirm_select();
    $acked = [];
    $ch->set_ack_handler(function (AMQPMessage $m) use (&$acked) { $acked[$m->get('message_id')] = true; });
    $ch->set_nack_handler(function (AMQPMessage $m) use (&$acked) { $acked[$m->get('message_id')] = false; });
    $q = name($target, 'dq');
    $ch->queue_declare($q, false, false, true, false);
    $ch->queue_bind($q, name($target, 'dx'), 'k');
    $ch->queue_bind($q, name($target, 'dt'), 'a.#');
    $sent = [];
    $want = [];
    foreach ($cases as [$check, $suffix, $key, $headers, $delay]) {
        $sent[$check] = now_ms();
        $ch->basic_publish(msg("body of $check", $headers, ['message_id' => $check, 'delivery_mode' => 2]),
            name($target, $suffix), $key);
        $ch->wait_for_pending_acks(20);
        if ($delay !== null) {
            $want[] = $check;
        }
    }
    $got = poll($ch, $q, $want);
    foreach ($cases as [$check, , , , $delay]) {
        if ($delay === null) {
            continue;
        }
        $arrived = isset($got[$check]);
        [$value, $type] = x_delay($arrived ? $got[$check][1] : null);
        $r = ['confirmed' => $acked[$check] ?? false, 'arrived' => $arrived,
            'elapsed_ms' => $arrived ? $got[$check][0] - $sent[$check] : null,
            'x_delay' => $value, 'x_delay_type' => $type];
        if ($check === 'delay_topic') {
            $r['unroutable_arrived'] = isset($got['delay_topic_unroutable']);
        }
        emit($check, $target, $r);
    }
    $c->close();
}

function new_queue($ch)
{
    [$q] = $ch->queue_declare('', false, false, true, false);
    return $q;
}

function count_of($ch, $q)
{
    [, $n] = $ch->queue_declare($q, true, false, true, false);
    return $n;
}

function get($ch)
{
    $q = new_queue($ch);
    $ch->basic_publish(msg('hello'), '', $q);
    $m = $ch->basic_get($q, true);
    $again = $ch->basic_get($q, true);
    return ['body' => $m->getBody(), 'redelivered' => $m->isRedelivered(),
        'message_count' => $m->getMessageCount(), 'then_empty' => $again === null];
}

// drain dispatches what arrives on $ch for $seconds.
function drain($ch, $seconds)
{
    $deadline = microtime(true) + $seconds;
    while (($left = $deadline - microtime(true)) > 0) {
        try {
            $ch->wait(null, false, $left);
        } catch (AMQPTimeoutException $e) {
            return;
        }
    }
}

function consume_ack($ch)
{
    $q = new_queue($ch);
    foreach (['m1', 'm2', 'm3'] as $b) {
        $ch->basic_publish(msg($b), '', $q);
    }
    $bodies = [];
    $tag = $ch->basic_consume($q, '', false, false, false, false, function (AMQPMessage $m) use (&$bodies) {
        $bodies[] = $m->getBody();
        $m->ack();
    });
    $deadline = microtime(true) + 5;
    while (count($bodies) < 3 && microtime(true) < $deadline) {
        drain($ch, 0.1);
    }
    $ch->basic_cancel($tag);
    return ['bodies' => $bodies, 'left' => count_of($ch, $q)];
}

function reject_requeue($ch)
{
    $q = new_queue($ch);
    $ch->basic_publish(msg('r'), '', $q);
    $redelivered = [];
    $m = $ch->basic_get($q);
    $redelivered[] = $m->isRedelivered();
    $m->reject(true);
    $m = $ch->basic_get($q);
    $redelivered[] = $m->isRedelivered();
    $m->nack(true);
    $m = $ch->basic_get($q);
    $redelivered[] = $m->isRedelivered();
    $m->ack();
    return ['redelivered' => $redelivered, 'left' => count_of($ch, $q)];
}

function qos($ch)
{
    $q = new_queue($ch);
    $ch->basic_qos(0, 1, false);
    $ch->basic_publish(msg('a'), '', $q);
    $ch->basic_publish(msg('b'), '', $q);
    $got = [];
    $ch->basic_consume($q, '', false, false, false, false, function (AMQPMessage $m) use (&$got) { $got[] = $m; });
    $pump = function ($n, $seconds) use ($ch, &$got) {
        $deadline = microtime(true) + $seconds;
        while (count($got) < $n && microtime(true) < $deadline) {
            drain($ch, 0.05);
        }
    };
    $pump(1, 5);
    $pump(2, 0.3); // a second one must not come before the ack
    $before = count($got);
    $got[0]->ack();
    $pump(2, 5);
    $after = count($got);
    foreach (array_slice($got, 1) as $m) {
        $m->ack();
    }
    return ['before_ack' => $before, 'after_ack' => $after];
}

function get_wait($ch, $q)
{
    $deadline = microtime(true) + 10;
    while (microtime(true) < $deadline) {
        $m = $ch->basic_get($q);
        if ($m !== null) {
            return $m;
        }
        usleep(10000);
    }
    throw new RuntimeException("no message in $q");
}

function quorum($ch, $target)
{
    $q = name($target, 'qq');
    $ch->queue_declare($q, false, true, false, false, false, new AMQPTable(['x-queue-type' => 'quorum']));
    try {
        $ch->confirm_select();
        $ch->basic_publish(msg('q'), '', $q);
        $ch->wait_for_pending_acks(20);
        $counts = [];
        foreach (['reject', 'nack', 'reject', 'ack'] as $settle) {
            $m = get_wait($ch, $q);
            $h = headers_of($m);
            $counts[] = $h['x-delivery-count'] ?? null;
            if ($settle === 'reject') {
                $m->reject(true);
            } elseif ($settle === 'nack') {
                $m->nack(true);
            } else {
                $m->ack();
            }
        }
        return ['counts' => $counts];
    } finally {
        $ch->queue_delete($q);
    }
}

function mandatory($ch, $target)
{
    $returned = null;
    $ch->set_return_listener(function ($code, $text, $exchange, $key) use (&$returned) {
        $returned = ['reply_code' => $code, 'reply_text' => $text, 'exchange' => $exchange, 'routing_key' => $key];
    });
    $ch->confirm_select();
    $ch->basic_publish(msg('m'), '', name($target, 'nowhere'), true);
    $ch->wait_for_pending_acks_returns(20);
    return $returned ?? ['reply_code' => null];
}

function tx($ch)
{
    $q = new_queue($ch);
    $ch->tx_select();
    $ch->basic_publish(msg('rolled back'), '', $q);
    $ch->tx_rollback();
    $afterRollback = count_of($ch, $q);
    $ch->basic_publish(msg('committed'), '', $q);
    $ch->tx_commit();
    return ['after_rollback' => $afterRollback, 'after_commit' => count_of($ch, $q)];
}

function tx_delayed($ch, $target)
{
    $q = name($target, 'txq');
    $ch->queue_declare($q, false, false, true, false);
    $ch->queue_bind($q, name($target, 'dx'), 'tx');
    $ch->tx_select();
    foreach (['rolled-back', 'committed'] as $id) {
        $t0 = now_ms();
        $ch->basic_publish(msg('tx', new AMQPTable(['x-delay' => DELAY_TX]), ['message_id' => $id]), name($target, 'dx'), 'tx');
        if ($id === 'rolled-back') {
            $ch->tx_rollback();
        } else {
            $ch->tx_commit();
        }
    }
    $got = poll($ch, $q, ['committed']);
    $arrived = isset($got['committed']);
    return ['committed_arrived' => $arrived,
        'committed_elapsed_ms' => $arrived ? $got['committed'][0] - $t0 : null,
        'committed_x_delay' => x_delay($arrived ? $got['committed'][1] : null)[0],
        'rolled_back_arrived' => isset($got['rolled-back'])];
}

// close_reopen closes, CLOSE_ROUNDS times, a connection with confirms in
// flight; reports the first failed close, then opens one more.
function close_reopen($target)
{
    $closeError = null;
    for ($round = 0; $round < CLOSE_ROUNDS && $closeError === null; $round++) {
        $c = connect($target);
        $ch = $c->channel();
        $q = new_queue($ch);
        $ch->confirm_select();
        for ($i = 0; $i < 500; $i++) {
            $ch->basic_publish(msg(str_repeat('x', 1000)), '', $q);
        }
        try {
            $c->close();
        } catch (Throwable $e) {
            $closeError = get_class($e) . ': ' . $e->getMessage();
        }
    }
    $c = connect($target);
    new_queue($c->channel());
    $c->close();
    return ['close_error' => $closeError, 'reopened' => true];
}

function publish_refused($c, $exchange, $headers = null)
{
    return refusal(function () use ($c, $exchange, $headers) {
        $ch = $c->channel();
        $ch->basic_publish(msg('m', $headers), $exchange, 'k');
        $ch->queue_declare('', false, false, true, false);
    });
}

function plain($target)
{
    $c = connect($target);
    run('get', $target, fn() => get($c->channel()));
    run('consume_ack', $target, fn() => consume_ack($c->channel()));
    run('reject_requeue', $target, fn() => reject_requeue($c->channel()));
    run('qos', $target, fn() => qos($c->channel()));
    run('quorum', $target, fn() => quorum($c->channel(), $target));
    run('mandatory', $target, fn() => mandatory($c->channel(), $target));
    run('tx', $target, fn() => tx($c->channel()));
    if ($target === 'proxy') {
        run('tx_delayed', $target, fn() => tx_delayed($c->channel(), $target));
    }
    run('error_406_queue', $target, function () use ($c, $target) {
        $q = name($target, 'eq');
        $c->channel()->queue_declare($q, false, false, true, false);
        return refusal(fn() => $c->channel()->queue_declare($q, false, false, true, false, false,
            new AMQPTable(['x-max-length' => 10])));
    });
    run('error_406_exchange', $target, function () use ($c, $target) {
        $x = name($target, 'px');
        $ch = $c->channel();
        $ch->exchange_declare($x, 'direct', false, false, false);
        try {
            return refusal(fn() => $c->channel()->exchange_declare($x, 'fanout', false, false, false));
        } finally {
            $ch->exchange_delete($x);
        }
    });
    run('error_404', $target, fn() => publish_refused($c, name($target, 'missing')));
    if ($target === 'proxy') {
        run('error_406_delay', $target, fn() => publish_refused($c, name($target, 'dx'), new AMQPTable(['x-delay' => 'abc'])));
        run('error_406_delayed_type', $target, fn() => refusal(fn() => declare_delayed($c->channel(), $target, 'dx', 'topic')));
    }
    $c->close();
    run('close_reopen', $target, fn() => close_reopen($target));
    run('error_403', $target, fn() => refusal(fn() => connect($target, 'wrong')->close()));
    run('error_530', $target, fn() => refusal(fn() => connect($target, null, 'no-such-vhost')->close()));
}

function cleanup($target)
{
    $c = connect($target);
    $ch = $c->channel();
    foreach (['dx', 'dt'] as $suffix) {
        $ch->exchange_delete(name($target, $suffix));
    }
    $c->close();
}

// php-amqplib writes a PHP float as a string, and no double ('d'): a
// fraction goes as a decimal ('D'), 400.7.
$float = new AMQPTable();
$float->set('x-delay', new AMQPDecimal((int)round(DELAY_FLOAT * 10), 1), AMQPTable::T_DECIMAL);
$cases = [
    ['delay_int', 'dx', 'k', new AMQPTable(['x-delay' => DELAY_INT]), DELAY_INT],
    ['delay_string', 'dx', 'k', new AMQPTable(['x-delay' => DELAY_STRING]), (int)DELAY_STRING],
    ['delay_float', 'dx', 'k', $float, (int)DELAY_FLOAT],
    ['delay_zero', 'dx', 'k', new AMQPTable(['x-delay' => 0]), 0],
    ['delay_missing', 'dx', 'k', null, 0],
    ['delay_topic_unroutable', 'dt', 'b.c', new AMQPTable(['x-delay' => DELAY_TOPIC]), null],
    ['delay_topic', 'dt', 'a.b.c', new AMQPTable(['x-delay' => DELAY_TOPIC]), DELAY_TOPIC],
];

foreach (['direct', 'proxy'] as $t) {
    run('server', $t, fn() => server($t));
}
// delayed_or_errors is delayed, reporting each case as failed if it throws.
function delayed_or_errors($target, array $cases, $emitDeclare)
{
    try {
        delayed($target, $cases, $emitDeclare);
    } catch (Throwable $e) {
        foreach ($cases as [$check, , , , $delay]) {
            if ($delay !== null) {
                emit($check, $target, null, get_class($e) . ': ' . $e->getMessage());
            }
        }
    }
}

delayed_or_errors('proxy', $cases, true);
delayed_or_errors('proxy32', [['delay_int', 'dx', 'k', new AMQPTable(['x-delay' => DELAY_INT32]), DELAY_INT32]], false);
foreach (['direct', 'proxy'] as $t) {
    plain($t);
}
foreach (['proxy', 'proxy32'] as $t) {
    cleanup($t);
}
