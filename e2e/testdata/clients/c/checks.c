/* The e2e client suite's checks with rabbitmq-c (Debian's librabbitmq-dev):
 * one JSON line per check and target, see e2e/clients_test.go. The test
 * compiles it once per run: cc checks.c -lrabbitmq. amqp-tools, rabbitmq-c's
 * command-line programs, are driven by the test itself. */

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* The delays the suite asks for, in milliseconds
 * (e2e/clients_expect_test.go). */
#define DELAY_INT 300
#define DELAY_STRING "350"
#define DELAY_FLOAT 400.7
#define DELAY_TOPIC 300
#define DELAY_INT32 450
#define DELAY_TX 300
#define ARRIVAL_TIMEOUT_MS 20000
/* How many connections close_reopen closes with confirms in flight: a reset
 * after close-ok comes in a third to a half of them (amqplib). */
#define CLOSE_ROUNDS 10

/* ---- JSON lines ---- */

/* buf is a growing string. */
typedef struct {
  char *s;
  size_t n, cap;
} buf;

static void bput(buf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    b->cap = (b->n + n + 1) * 2;
    b->s = realloc(b->s, b->cap);
    if (!b->s) abort();
  }
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = 0;
}

static void bprintf(buf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  bput(b, tmp, n < (int)sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* bstr appends n bytes of s as a JSON string, or null when s is NULL. */
static void bstr(buf *b, const char *s, size_t n) {
  if (!s) {
    bput(b, "null", 4);
    return;
  }
  bput(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = s[i];
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', c};
      bput(b, e, 2);
    } else if (c < 0x20) {
      bprintf(b, "\\u%04x", c);
    } else {
      bput(b, (const char *)&c, 1);
    }
  }
  bput(b, "\"", 1);
}

static void bcstr(buf *b, const char *s) { bstr(b, s, s ? strlen(s) : 0); }

static void emit(const char *check, const char *target, buf *result, const char *error) {
  buf line = {0};
  bput(&line, "{\"check\":", 9);
  bcstr(&line, check);
  bput(&line, ",\"target\":", 10);
  bcstr(&line, target);
  if (error) {
    bput(&line, ",\"error\":", 9);
    bcstr(&line, error);
  } else {
    bput(&line, ",\"result\":", 10);
    bput(&line, result->s, result->n);
  }
  bput(&line, "}\n", 2);
  fwrite(line.s, 1, line.n, stdout);
  fflush(stdout);
  free(line.s);
}

/* ---- connections ---- */

static const char *addr(const char *target) {
  if (!strcmp(target, "direct")) return getenv("CLIENT_DIRECT_ADDR");
  if (!strcmp(target, "proxy")) return getenv("CLIENT_PROXY_ADDR");
  return getenv("CLIENT_PROXY32_ADDR");
}

static void name(char *out, size_t n, const char *target, const char *suffix) {
  snprintf(out, n, "%s.%s.%s", getenv("CLIENT_PREFIX"), target, suffix);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms) { usleep(ms * 1000); }

/* refusal is what a reply said: code 0 and the library's words when it was
 * no refusal of the server's. */
typedef struct {
  int code;
  char text[512];
} refusal;

static refusal refusal_of(amqp_rpc_reply_t r) {
  refusal f = {0};
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      snprintf(f.text, sizeof f.text, "not refused");
      break;
    case AMQP_RESPONSE_NONE:
      snprintf(f.text, sizeof f.text, "no reply");
      break;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      snprintf(f.text, sizeof f.text, "library: %s", amqp_error_string2(r.library_error));
      break;
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        amqp_channel_close_t *c = r.reply.decoded;
        f.code = c->reply_code;
        snprintf(f.text, sizeof f.text, "%.*s", (int)c->reply_text.len, (char *)c->reply_text.bytes);
      } else if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        amqp_connection_close_t *c = r.reply.decoded;
        f.code = c->reply_code;
        snprintf(f.text, sizeof f.text, "%.*s", (int)c->reply_text.len, (char *)c->reply_text.bytes);
      } else {
        snprintf(f.text, sizeof f.text, "server method 0x%08x", r.reply.id);
      }
      break;
  }
  return f;
}

static void bput_refusal(buf *b, refusal f) {
  if (f.code) {
    bprintf(b, "{\"code\":%d,\"text\":", f.code);
  } else {
    bput(b, "{\"code\":null,\"text\":", 20);
  }
  bcstr(b, f.text);
  bput(b, "}", 1);
}

/* failure is a check's error: what went wrong, for its "error" line. */
static char failure[1024];

static int fail(const char *what, amqp_rpc_reply_t r) {
  refusal f = refusal_of(r);
  snprintf(failure, sizeof failure, "%s: %d %s", what, f.code, f.text);
  return -1;
}

static int failf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(failure, sizeof failure, fmt, ap);
  va_end(ap);
  return -1;
}

/* connect_to opens a connection to target, channel_max as RabbitMQ offers
 * (0: no limit of the client's); on failure *why (when not NULL) says why. */
static amqp_connection_state_t connect_to(const char *target, const char *password, const char *vhost,
                                          refusal *why) {
  char host[256];
  snprintf(host, sizeof host, "%s", addr(target));
  char *colon = strrchr(host, ':');
  *colon = 0;
  amqp_connection_state_t c = amqp_new_connection();
  amqp_socket_t *s = amqp_tcp_socket_new(c);
  amqp_rpc_reply_t r = {0};
  int st = amqp_socket_open(s, host, atoi(colon + 1));
  if (st != AMQP_STATUS_OK) {
    r.reply_type = AMQP_RESPONSE_LIBRARY_EXCEPTION;
    r.library_error = st;
  } else {
    r = amqp_login(c, vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, getenv("CLIENT_USER"),
                   password ? password : getenv("CLIENT_PASSWORD"));
  }
  if (why) *why = refusal_of(r); /* before the connection, which holds the reply, goes */
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    amqp_destroy_connection(c);
    return NULL;
  }
  return c;
}

static void disconnect(amqp_connection_state_t c) {
  amqp_connection_close(c, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(c);
}

/* channels hands out channel numbers: one per use. */
static amqp_channel_t next_channel = 1;

static amqp_channel_t open_channel(amqp_connection_state_t c) {
  amqp_channel_t ch = next_channel++;
  amqp_channel_open(c, ch);
  return ch;
}

/* close_ok answers a channel.close of the server's. */
static void close_ok(amqp_connection_state_t c, amqp_channel_t ch, amqp_rpc_reply_t r) {
  if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
    amqp_channel_close_ok_t ok = {0};
    amqp_send_method(c, ch, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
  }
}

static amqp_table_t table1(amqp_table_entry_t *e, const char *key, amqp_field_value_t v) {
  e->key = amqp_cstring_bytes(key);
  e->value = v;
  return (amqp_table_t){1, e};
}

static amqp_field_value_t field_i32(int32_t v) {
  amqp_field_value_t f = {.kind = AMQP_FIELD_KIND_I32};
  f.value.i32 = v;
  return f;
}

static amqp_field_value_t field_str(const char *s) {
  amqp_field_value_t f = {.kind = AMQP_FIELD_KIND_UTF8};
  f.value.bytes = amqp_cstring_bytes(s);
  return f;
}

static amqp_field_value_t field_f64(double v) {
  amqp_field_value_t f = {.kind = AMQP_FIELD_KIND_F64};
  f.value.f64 = v;
  return f;
}

static amqp_field_value_t *header(amqp_basic_properties_t *p, const char *key) {
  if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG)) return NULL;
  for (int i = 0; i < p->headers.num_entries; i++) {
    amqp_table_entry_t *e = &p->headers.entries[i];
    if (e->key.len == strlen(key) && !memcmp(e->key.bytes, key, e->key.len)) return &e->value;
  }
  return NULL;
}

/* field_text writes an integer field's value and rabbitmq-c's type for it. */
static void field_text(amqp_field_value_t *v, char *value, size_t n, const char **type) {
  switch (v->kind) {
    case AMQP_FIELD_KIND_I8: snprintf(value, n, "%d", v->value.i8); *type = "int8_t"; break;
    case AMQP_FIELD_KIND_U8: snprintf(value, n, "%u", v->value.u8); *type = "uint8_t"; break;
    case AMQP_FIELD_KIND_I16: snprintf(value, n, "%d", v->value.i16); *type = "int16_t"; break;
    case AMQP_FIELD_KIND_U16: snprintf(value, n, "%u", v->value.u16); *type = "uint16_t"; break;
    case AMQP_FIELD_KIND_I32: snprintf(value, n, "%d", v->value.i32); *type = "int32_t"; break;
    case AMQP_FIELD_KIND_U32: snprintf(value, n, "%u", v->value.u32); *type = "uint32_t"; break;
    case AMQP_FIELD_KIND_I64: snprintf(value, n, "%lld", (long long)v->value.i64); *type = "int64_t"; break;
    case AMQP_FIELD_KIND_U64: snprintf(value, n, "%llu", (unsigned long long)v->value.u64); *type = "uint64_t"; break;
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES:
      snprintf(value, n, "%.*s", (int)v->value.bytes.len, (char *)v->value.bytes.bytes);
      *type = "amqp_bytes_t";
      break;
    default: snprintf(value, n, "kind %c", v->kind); *type = "other"; break;
  }
}

static int publish(amqp_connection_state_t c, amqp_channel_t ch, const char *exchange, const char *key,
                   int mandatory, amqp_basic_properties_t *props, const char *body) {
  return amqp_basic_publish(c, ch, amqp_cstring_bytes(exchange), amqp_cstring_bytes(key), mandatory, 0, props,
                            amqp_cstring_bytes(body));
}

/* wait_confirm reads frames until the publish's basic.ack (1) or
 * basic.nack (0); a basic.return before it is stored in *ret (with its
 * message read and dropped) when ret is not NULL. */
static int wait_confirm(amqp_connection_state_t c, amqp_basic_return_t *ret, char *ret_text, size_t n) {
  for (;;) {
    amqp_frame_t f;
    struct timeval tv = {20, 0};
    if (amqp_simple_wait_frame_noblock(c, &f, &tv) != AMQP_STATUS_OK) return failf("no confirm in 20 s");
    if (f.frame_type != AMQP_FRAME_METHOD) continue;
    switch (f.payload.method.id) {
      case AMQP_BASIC_ACK_METHOD: return 1;
      case AMQP_BASIC_NACK_METHOD: return 0;
      case AMQP_BASIC_RETURN_METHOD: {
        amqp_basic_return_t *r = f.payload.method.decoded;
        if (ret) {
          *ret = *r;
          snprintf(ret_text, n, "%.*s|%.*s|%.*s", (int)r->reply_text.len, (char *)r->reply_text.bytes,
                   (int)r->exchange.len, (char *)r->exchange.bytes, (int)r->routing_key.len,
                   (char *)r->routing_key.bytes);
        }
        amqp_message_t m;
        amqp_read_message(c, f.channel, &m, 0);
        amqp_destroy_message(&m);
        break;
      }
      default: return failf("unexpected method 0x%08x while waiting for a confirm", f.payload.method.id);
    }
  }
}

/* got is one message basic.get took: when, its message-id and x-delay. */
typedef struct {
  char id[64];
  double at;
  char x_delay[128];
  const char *x_delay_type;
} got;

/* get_one takes a message from queue: 1 with *m filled (the caller
 * destroys it) and *ok its get-ok, 0 when the queue is empty, -1 on
 * error. */
static int get_one(amqp_connection_state_t c, amqp_channel_t ch, const char *queue, int no_ack, amqp_message_t *m,
                   amqp_basic_get_ok_t *ok) {
  amqp_rpc_reply_t r = amqp_basic_get(c, ch, amqp_cstring_bytes(queue), no_ack);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) return fail("basic.get", r);
  if (r.reply.id == AMQP_BASIC_GET_EMPTY_METHOD) return 0;
  if (ok) *ok = *(amqp_basic_get_ok_t *)r.reply.decoded;
  r = amqp_read_message(c, ch, m, 0);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) return fail("read message", r);
  return 1;
}

static got *find(got *g, int n, const char *id) {
  for (int i = 0; i < n; i++)
    if (!strcmp(g[i].id, id)) return &g[i];
  return NULL;
}

/* poll takes messages from queue until every id of want arrived, and 300
 * ms more; it returns how many it took into g (at most max). */
static int poll(amqp_connection_state_t c, amqp_channel_t ch, const char *queue, const char **want, int nwant, got *g,
                int max) {
  int n = 0;
  double deadline = now_ms() + ARRIVAL_TIMEOUT_MS, quiet_until = 0;
  while (now_ms() < deadline) {
    amqp_message_t m;
    int r = get_one(c, ch, queue, 1, &m, NULL);
    if (r < 0) return -1;
    if (r == 1) {
      if (n < max) {
        got *x = &g[n++];
        memset(x, 0, sizeof *x);
        x->at = now_ms();
        if (m.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG)
          snprintf(x->id, sizeof x->id, "%.*s", (int)m.properties.message_id.len, (char *)m.properties.message_id.bytes);
        amqp_field_value_t *v = header(&m.properties, "x-delay");
        if (v) field_text(v, x->x_delay, sizeof x->x_delay, &x->x_delay_type);
      }
      amqp_destroy_message(&m);
      continue;
    }
    int all = 1;
    for (int i = 0; i < nwant; i++)
      if (!find(g, n, want[i])) all = 0;
    if (all) {
      if (!quiet_until) quiet_until = now_ms() + 300;
      else if (now_ms() >= quiet_until) break;
    }
    sleep_ms(10);
  }
  return n;
}

/* ---- checks ---- */

static int server(const char *target, buf *out) {
  refusal why;
  amqp_connection_state_t c = connect_to(target, NULL, "/", &why);
  if (!c) return failf("connect: %d %s", why.code, why.text);
  amqp_table_t *p = amqp_get_server_properties(c);
  bput(out, "{", 1);
  for (int i = 0; i < p->num_entries; i++) {
    amqp_table_entry_t *e = &p->entries[i];
    const char *k = NULL;
    if (e->key.len == 7 && !memcmp(e->key.bytes, "product", 7)) k = "product";
    if (e->key.len == 7 && !memcmp(e->key.bytes, "version", 7)) k = "version";
    if (!k) continue;
    bprintf(out, "\"%s\":", k);
    bstr(out, e->value.value.bytes.bytes, e->value.value.bytes.len);
    bput(out, ",", 1);
  }
  bprintf(out, "\"channel_max\":%d}", amqp_get_channel_max(c));
  disconnect(c);
  return 0;
}

/* delayed_case is one delayed publish: the check it reports, the
 * exchange's suffix, the routing key, x-delay (kind 0: none) and the
 * delay (-1: it must not arrive). */
typedef struct {
  const char *check, *suffix, *key;
  amqp_field_value_t x_delay;
  int delay;
} delayed_case;

static void delayed(const char *target, delayed_case *cases, int ncases, int emit_declare) {
  refusal why;
  amqp_connection_state_t c = connect_to(target, NULL, "/", &why);
  if (!c) {
    failf("connect: %d %s", why.code, why.text);
    for (int i = 0; i < ncases; i++)
      if (cases[i].delay >= 0) emit(cases[i].check, target, NULL, failure);
    return;
  }
  amqp_channel_t ch = open_channel(c);
  buf decl = {0};
  bput(&decl, "{", 1);
  const char *types[] = {"direct", "topic"}, *suffixes[] = {"dx", "dt"};
  for (int i = 0; i < 2; i++) {
    char x[256];
    name(x, sizeof x, target, suffixes[i]);
    amqp_table_entry_t e;
    amqp_exchange_declare(c, ch, amqp_cstring_bytes(x), amqp_cstring_bytes("x-delayed-message"), 0, 1, 0, 0,
                          table1(&e, "x-delayed-type", field_str(types[i])));
    amqp_rpc_reply_t dr = amqp_get_rpc_reply(c);
    bprintf(&decl, "%s\"%s\":", i ? "," : "", types[i]);
    if (dr.reply_type == AMQP_RESPONSE_NORMAL) {
      bcstr(&decl, "ok");
    } else {
      close_ok(c, ch, dr);
      bcstr(&decl, refusal_of(dr).text);
      ch = open_channel(c);
    }
  }
  bput(&decl, "}", 1);
  if (emit_declare) emit("declare", target, &decl, NULL);
  free(decl.s);

  char q[256], dx[256], dt[256];
  name(q, sizeof q, target, "dq");
  name(dx, sizeof dx, target, "dx");
  name(dt, sizeof dt, target, "dt");
  amqp_confirm_select(c, ch);
  amqp_queue_declare(c, ch, amqp_cstring_bytes(q), 0, 0, 1, 0, amqp_empty_table);
  amqp_queue_bind(c, ch, amqp_cstring_bytes(q), amqp_cstring_bytes(dx), amqp_cstring_bytes("k"), amqp_empty_table);
  amqp_queue_bind(c, ch, amqp_cstring_bytes(q), amqp_cstring_bytes(dt), amqp_cstring_bytes("a.#"), amqp_empty_table);
  double sent[16];
  int confirmed[16];
  const char *want[16];
  int nwant = 0;
  for (int i = 0; i < ncases; i++) {
    char x[256], body[128];
    name(x, sizeof x, target, cases[i].suffix);
    snprintf(body, sizeof body, "body of %s", cases[i].check);
    amqp_table_entry_t e;
    amqp_basic_properties_t p = {0};
    p._flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    p.message_id = amqp_cstring_bytes(cases[i].check);
    p.delivery_mode = 2;
    if (cases[i].x_delay.kind) {
      p._flags |= AMQP_BASIC_HEADERS_FLAG;
      p.headers = table1(&e, "x-delay", cases[i].x_delay);
    }
    sent[i] = now_ms();
    publish(c, ch, x, cases[i].key, 0, &p, body);
    confirmed[i] = wait_confirm(c, NULL, NULL, 0) == 1;
    if (cases[i].delay >= 0) want[nwant++] = cases[i].check;
  }
  got g[32];
  int n = poll(c, ch, q, want, nwant, g, 32);
  for (int i = 0; i < ncases; i++) {
    if (cases[i].delay < 0) continue;
    if (n < 0) {
      emit(cases[i].check, target, NULL, failure);
      continue;
    }
    got *a = find(g, n, cases[i].check);
    buf res = {0};
    bprintf(&res, "{\"confirmed\":%s,\"arrived\":%s,\"elapsed_ms\":", confirmed[i] ? "true" : "false",
            a ? "true" : "false");
    if (a) bprintf(&res, "%.3f", a->at - sent[i]);
    else bput(&res, "null", 4);
    bput(&res, ",\"x_delay\":", 11);
    bcstr(&res, a && a->x_delay_type ? a->x_delay : NULL);
    bput(&res, ",\"x_delay_type\":", 16);
    bcstr(&res, a ? a->x_delay_type : NULL);
    if (!strcmp(cases[i].check, "delay_topic"))
      bprintf(&res, ",\"unroutable_arrived\":%s", find(g, n, "delay_topic_unroutable") ? "true" : "false");
    bput(&res, "}", 1);
    emit(cases[i].check, target, &res, NULL);
    free(res.s);
  }
  disconnect(c);
}

/* new_queue declares a server-named exclusive queue into q. */
static int new_queue(amqp_connection_state_t c, amqp_channel_t ch, char *q, size_t n) {
  amqp_queue_declare_ok_t *ok = amqp_queue_declare(c, ch, amqp_empty_bytes, 0, 0, 1, 0, amqp_empty_table);
  if (!ok) return fail("queue.declare", amqp_get_rpc_reply(c));
  snprintf(q, n, "%.*s", (int)ok->queue.len, (char *)ok->queue.bytes);
  return 0;
}

static int count_of(amqp_connection_state_t c, amqp_channel_t ch, const char *q) {
  amqp_queue_declare_ok_t *ok = amqp_queue_declare(c, ch, amqp_cstring_bytes(q), 1, 0, 1, 0, amqp_empty_table);
  if (!ok) return fail("passive queue.declare", amqp_get_rpc_reply(c));
  return ok->message_count;
}

static int get(amqp_connection_state_t c, buf *out) {
  amqp_channel_t ch = open_channel(c);
  char q[256];
  if (new_queue(c, ch, q, sizeof q)) return -1;
  publish(c, ch, "", q, 0, NULL, "hello");
  amqp_message_t m;
  amqp_basic_get_ok_t ok;
  if (get_one(c, ch, q, 1, &m, &ok) != 1) return failf("basic.get: %s", failure);
  amqp_message_t m2;
  int again = get_one(c, ch, q, 1, &m2, NULL);
  if (again == 1) amqp_destroy_message(&m2);
  bput(out, "{\"body\":", 8);
  bstr(out, m.body.bytes, m.body.len);
  bprintf(out, ",\"redelivered\":%s,\"message_count\":%u,\"then_empty\":%s}", ok.redelivered ? "true" : "false",
          ok.message_count, again == 0 ? "true" : "false");
  amqp_destroy_message(&m);
  return 0;
}

static int consume_ack(amqp_connection_state_t c, buf *out) {
  amqp_channel_t ch = open_channel(c);
  char q[256];
  if (new_queue(c, ch, q, sizeof q)) return -1;
  const char *bodies[] = {"m1", "m2", "m3"};
  for (int i = 0; i < 3; i++) publish(c, ch, "", q, 0, NULL, bodies[i]);
  amqp_basic_consume_ok_t *ok =
      amqp_basic_consume(c, ch, amqp_cstring_bytes(q), amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
  if (!ok) return fail("basic.consume", amqp_get_rpc_reply(c));
  amqp_bytes_t tag = amqp_bytes_malloc_dup(ok->consumer_tag);
  bput(out, "{\"bodies\":[", 11);
  for (int i = 0; i < 3; i++) {
    amqp_envelope_t env;
    struct timeval tv = {5, 0};
    amqp_rpc_reply_t r = amqp_consume_message(c, &env, &tv, 0);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) break;
    if (i) bput(out, ",", 1);
    bstr(out, env.message.body.bytes, env.message.body.len);
    amqp_basic_ack(c, ch, env.delivery_tag, 0);
    amqp_destroy_envelope(&env);
  }
  amqp_basic_cancel(c, ch, tag);
  amqp_bytes_free(tag);
  bprintf(out, "],\"left\":%d}", count_of(c, ch, q));
  return 0;
}

static int reject_requeue(amqp_connection_state_t c, buf *out) {
  amqp_channel_t ch = open_channel(c);
  char q[256];
  if (new_queue(c, ch, q, sizeof q)) return -1;
  publish(c, ch, "", q, 0, NULL, "r");
  bput(out, "{\"redelivered\":[", 16);
  for (int i = 0; i < 3; i++) {
    amqp_message_t m;
    amqp_basic_get_ok_t ok;
    if (get_one(c, ch, q, 0, &m, &ok) != 1) return failf("basic.get %d: %s", i, failure);
    amqp_destroy_message(&m);
    bprintf(out, "%s%s", i ? "," : "", ok.redelivered ? "true" : "false");
    if (i == 0) amqp_basic_reject(c, ch, ok.delivery_tag, 1);
    if (i == 1) amqp_basic_nack(c, ch, ok.delivery_tag, 0, 1);
    if (i == 2) amqp_basic_ack(c, ch, ok.delivery_tag, 0);
  }
  bprintf(out, "],\"left\":%d}", count_of(c, ch, q));
  return 0;
}

/* deliveries counts what a consumer gets in ms, at most max, keeping the
 * first tag. */
static int deliveries(amqp_connection_state_t c, int ms, int max, uint64_t *first_tag) {
  int n = 0;
  double deadline = now_ms() + ms;
  while (n < max) {
    double left = deadline - now_ms();
    if (left <= 0) return n;
    struct timeval tv = {(long)left / 1000, ((long)left % 1000) * 1000};
    amqp_envelope_t env;
    amqp_rpc_reply_t r = amqp_consume_message(c, &env, &tv, 0);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) return n;
    if (first_tag && !*first_tag) *first_tag = env.delivery_tag;
    n++;
    amqp_destroy_envelope(&env);
  }
  return n;
}

static int qos(amqp_connection_state_t c, buf *out) {
  amqp_channel_t ch = open_channel(c);
  char q[256];
  if (new_queue(c, ch, q, sizeof q)) return -1;
  amqp_basic_qos(c, ch, 0, 1, 0);
  publish(c, ch, "", q, 0, NULL, "a");
  publish(c, ch, "", q, 0, NULL, "b");
  if (!amqp_basic_consume(c, ch, amqp_cstring_bytes(q), amqp_empty_bytes, 0, 0, 0, amqp_empty_table))
    return fail("basic.consume", amqp_get_rpc_reply(c));
  uint64_t tag = 0;
  int before = deliveries(c, 5000, 1, &tag);
  before += deliveries(c, 300, 1, NULL); /* a second one must not come before the ack */
  amqp_basic_ack(c, ch, tag, 0);
  int after = before + deliveries(c, 5000, 1, NULL);
  amqp_basic_ack(c, ch, 0, 1); /* all the rest */
  bprintf(out, "{\"before_ack\":%d,\"after_ack\":%d}", before, after);
  return 0;
}

static int quorum(amqp_connection_state_t c, const char *target, buf *out) {
  amqp_channel_t ch = open_channel(c);
  char q[256];
  name(q, sizeof q, target, "qq");
  amqp_table_entry_t e;
  if (!amqp_queue_declare(c, ch, amqp_cstring_bytes(q), 0, 1, 0, 0,
                          table1(&e, "x-queue-type", field_str("quorum"))))
    return fail("queue.declare", amqp_get_rpc_reply(c));
  amqp_confirm_select(c, ch);
  publish(c, ch, "", q, 0, NULL, "q");
  int rc = wait_confirm(c, NULL, NULL, 0) == 1 ? 0 : failf("quorum publish not confirmed");
  bput(out, "{\"counts\":[", 11);
  for (int i = 0; i < 4 && !rc; i++) {
    amqp_message_t m;
    amqp_basic_get_ok_t ok;
    int got_one = 0;
    for (double deadline = now_ms() + 10000; now_ms() < deadline;) {
      got_one = get_one(c, ch, q, 0, &m, &ok);
      if (got_one) break;
      sleep_ms(10);
    }
    if (got_one != 1) {
      rc = failf("quorum queue: no message (%s)", failure);
      break;
    }
    amqp_field_value_t *v = header(&m.properties, "x-delivery-count");
    char value[64] = "null";
    const char *type;
    if (v) field_text(v, value, sizeof value, &type);
    bprintf(out, "%s%s", i ? "," : "", value);
    amqp_destroy_message(&m);
    if (i == 0 || i == 2) amqp_basic_reject(c, ch, ok.delivery_tag, 1);
    if (i == 1) amqp_basic_nack(c, ch, ok.delivery_tag, 0, 1);
    if (i == 3) amqp_basic_ack(c, ch, ok.delivery_tag, 0);
  }
  bput(out, "]}", 2);
  amqp_queue_delete(c, ch, amqp_cstring_bytes(q), 0, 0);
  return rc;
}

static int mandatory(amqp_connection_state_t c, const char *target, buf *out) {
  amqp_channel_t ch = open_channel(c);
  char key[256], text[768] = "";
  name(key, sizeof key, target, "nowhere");
  amqp_confirm_select(c, ch);
  publish(c, ch, "", key, 1, NULL, "m");
  amqp_basic_return_t ret = {0};
  if (wait_confirm(c, &ret, text, sizeof text) < 0) return -1;
  if (!ret.reply_code) {
    bput(out, "{\"reply_code\":null}", 19);
    return 0;
  }
  char *exchange = strchr(text, '|');
  *exchange++ = 0;
  char *routing_key = strchr(exchange, '|');
  *routing_key++ = 0;
  bprintf(out, "{\"reply_code\":%d,\"reply_text\":", ret.reply_code);
  bcstr(out, text);
  bput(out, ",\"exchange\":", 12);
  bcstr(out, exchange);
  bput(out, ",\"routing_key\":", 15);
  bcstr(out, routing_key);
  bput(out, "}", 1);
  return 0;
}

static int tx(amqp_connection_state_t c, buf *out) {
  amqp_channel_t ch = open_channel(c);
  char q[256];
  if (new_queue(c, ch, q, sizeof q)) return -1;
  amqp_tx_select(c, ch);
  publish(c, ch, "", q, 0, NULL, "rolled back");
  amqp_tx_rollback(c, ch);
  int after_rollback = count_of(c, ch, q);
  publish(c, ch, "", q, 0, NULL, "committed");
  amqp_tx_commit(c, ch);
  bprintf(out, "{\"after_rollback\":%d,\"after_commit\":%d}", after_rollback, count_of(c, ch, q));
  return 0;
}

static int tx_delayed(amqp_connection_state_t c, const char *target, buf *out) {
  amqp_channel_t ch = open_channel(c);
  char q[256], dx[256];
  name(q, sizeof q, target, "txq");
  name(dx, sizeof dx, target, "dx");
  amqp_queue_declare(c, ch, amqp_cstring_bytes(q), 0, 0, 1, 0, amqp_empty_table);
  amqp_queue_bind(c, ch, amqp_cstring_bytes(q), amqp_cstring_bytes(dx), amqp_cstring_bytes("tx"), amqp_empty_table);
  amqp_tx_select(c, ch);
  double t0 = 0;
  const char *ids[] = {"rolled-back", "committed"};
  for (int i = 0; i < 2; i++) {
    amqp_table_entry_t e;
    amqp_basic_properties_t p = {0};
    p._flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_HEADERS_FLAG;
    p.message_id = amqp_cstring_bytes(ids[i]);
    p.headers = table1(&e, "x-delay", field_i32(DELAY_TX));
    t0 = now_ms();
    publish(c, ch, dx, "tx", 0, &p, "tx");
    if (i == 0) amqp_tx_rollback(c, ch);
    else amqp_tx_commit(c, ch);
  }
  const char *want[] = {"committed"};
  got g[8];
  int n = poll(c, ch, q, want, 1, g, 8);
  if (n < 0) return -1;
  got *a = find(g, n, "committed");
  bprintf(out, "{\"committed_arrived\":%s,\"committed_elapsed_ms\":", a ? "true" : "false");
  if (a) bprintf(out, "%.3f", a->at - t0);
  else bput(out, "null", 4);
  bput(out, ",\"committed_x_delay\":", 21);
  bcstr(out, a && a->x_delay_type ? a->x_delay : NULL);
  bprintf(out, ",\"rolled_back_arrived\":%s}", find(g, n, "rolled-back") ? "true" : "false");
  return 0;
}

/* close_reopen closes, CLOSE_ROUNDS times, a connection with confirms in
 * flight; it reports the first close that failed, then opens one more. */
static int close_reopen(const char *target, buf *out) {
  char close_error[600] = "";
  for (int round = 0; round < CLOSE_ROUNDS && !close_error[0]; round++) {
    refusal why;
    amqp_connection_state_t c = connect_to(target, NULL, "/", &why);
    if (!c) return failf("connect: %d %s", why.code, why.text);
    amqp_channel_t ch = open_channel(c);
    char q[256];
    if (new_queue(c, ch, q, sizeof q)) return -1;
    amqp_confirm_select(c, ch);
    static char body[1001];
    memset(body, 'x', 1000);
    for (int i = 0; i < 500; i++) publish(c, ch, "", q, 0, NULL, body);
    amqp_rpc_reply_t r = amqp_connection_close(c, AMQP_REPLY_SUCCESS);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      refusal f = refusal_of(r);
      snprintf(close_error, sizeof close_error, "%d %s", f.code, f.text);
    }
    amqp_destroy_connection(c);
  }
  amqp_connection_state_t c = connect_to(target, NULL, "/", NULL);
  if (c) disconnect(c);
  bput(out, "{\"close_error\":", 15);
  bcstr(out, close_error[0] ? close_error : NULL);
  bprintf(out, ",\"reopened\":%s}", c ? "true" : "false");
  return 0;
}

/* the refusals: each appends {"code":..,"text":..} */

static int error_406_queue(amqp_connection_state_t c, const char *target, buf *out) {
  char q[256];
  name(q, sizeof q, target, "eq");
  amqp_channel_t ch = open_channel(c);
  amqp_queue_declare(c, ch, amqp_cstring_bytes(q), 0, 0, 1, 0, amqp_empty_table);
  amqp_channel_t ch2 = open_channel(c);
  amqp_table_entry_t e;
  amqp_queue_declare(c, ch2, amqp_cstring_bytes(q), 0, 0, 1, 0, table1(&e, "x-max-length", field_i32(10)));
  amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
  close_ok(c, ch2, r);
  bput_refusal(out, refusal_of(r));
  return 0;
}

static int error_406_exchange(amqp_connection_state_t c, const char *target, buf *out) {
  char x[256];
  name(x, sizeof x, target, "px");
  amqp_channel_t ch = open_channel(c);
  amqp_exchange_declare(c, ch, amqp_cstring_bytes(x), amqp_cstring_bytes("direct"), 0, 0, 0, 0, amqp_empty_table);
  amqp_channel_t ch2 = open_channel(c);
  amqp_exchange_declare(c, ch2, amqp_cstring_bytes(x), amqp_cstring_bytes("fanout"), 0, 0, 0, 0, amqp_empty_table);
  amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
  close_ok(c, ch2, r);
  amqp_exchange_delete(c, ch, amqp_cstring_bytes(x), 0);
  bput_refusal(out, refusal_of(r));
  return 0;
}

/* publish_refused publishes to exchange, then declares a queue: the
 * channel.close that answers the publish comes instead of declare-ok. */
static int publish_refused(amqp_connection_state_t c, const char *exchange, amqp_field_value_t *x_delay, buf *out) {
  amqp_channel_t ch = open_channel(c);
  amqp_table_entry_t e;
  amqp_basic_properties_t p = {0};
  if (x_delay) {
    p._flags = AMQP_BASIC_HEADERS_FLAG;
    p.headers = table1(&e, "x-delay", *x_delay);
  }
  publish(c, ch, exchange, "k", 0, &p, "m");
  amqp_queue_declare(c, ch, amqp_empty_bytes, 0, 0, 1, 0, amqp_empty_table);
  amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
  close_ok(c, ch, r);
  bput_refusal(out, refusal_of(r));
  return 0;
}

static int error_406_delayed_type(amqp_connection_state_t c, const char *target, buf *out) {
  char x[256];
  name(x, sizeof x, target, "dx");
  amqp_channel_t ch = open_channel(c);
  amqp_table_entry_t e;
  amqp_exchange_declare(c, ch, amqp_cstring_bytes(x), amqp_cstring_bytes("x-delayed-message"), 0, 1, 0, 0,
                        table1(&e, "x-delayed-type", field_str("topic")));
  amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
  close_ok(c, ch, r);
  bput_refusal(out, refusal_of(r));
  return 0;
}

static int login_refused(const char *target, const char *password, const char *vhost, buf *out) {
  refusal why;
  amqp_connection_state_t c = connect_to(target, password, vhost, &why);
  if (c) disconnect(c);
  bput_refusal(out, why);
  return 0;
}

/* run_check emits check's line for target: the result fn appended, or the
 * failure it reported. */
#define RUN(check, target, call)                        \
  do {                                                  \
    buf out_ = {0};                                     \
    failure[0] = 0;                                     \
    if ((call) == 0) emit(check, target, &out_, NULL);  \
    else emit(check, target, NULL, failure);            \
    free(out_.s);                                       \
  } while (0)

static void plain(const char *target) {
  refusal why;
  amqp_connection_state_t c = connect_to(target, NULL, "/", &why);
  if (!c) {
    failf("connect: %d %s", why.code, why.text);
    emit("get", target, NULL, failure);
    return;
  }
  int proxy = !strcmp(target, "proxy");
  char missing[256], dx[256];
  name(missing, sizeof missing, target, "missing");
  name(dx, sizeof dx, target, "dx");
  RUN("get", target, get(c, &out_));
  RUN("consume_ack", target, consume_ack(c, &out_));
  RUN("reject_requeue", target, reject_requeue(c, &out_));
  RUN("qos", target, qos(c, &out_));
  RUN("quorum", target, quorum(c, target, &out_));
  RUN("mandatory", target, mandatory(c, target, &out_));
  RUN("tx", target, tx(c, &out_));
  if (proxy) RUN("tx_delayed", target, tx_delayed(c, target, &out_));
  RUN("error_406_queue", target, error_406_queue(c, target, &out_));
  RUN("error_406_exchange", target, error_406_exchange(c, target, &out_));
  RUN("error_404", target, publish_refused(c, missing, NULL, &out_));
  if (proxy) {
    amqp_field_value_t abc = field_str("abc");
    RUN("error_406_delay", target, publish_refused(c, dx, &abc, &out_));
    RUN("error_406_delayed_type", target, error_406_delayed_type(c, target, &out_));
  }
  disconnect(c);
  RUN("close_reopen", target, close_reopen(target, &out_));
  RUN("error_403", target, login_refused(target, "wrong", "/", &out_));
  RUN("error_530", target, login_refused(target, NULL, "no-such-vhost", &out_));
}

static void cleanup(const char *target) {
  amqp_connection_state_t c = connect_to(target, NULL, "/", NULL);
  if (!c) return;
  amqp_channel_t ch = open_channel(c);
  const char *suffixes[] = {"dx", "dt"};
  for (int i = 0; i < 2; i++) {
    char x[256];
    name(x, sizeof x, target, suffixes[i]);
    amqp_exchange_delete(c, ch, amqp_cstring_bytes(x), 0);
  }
  disconnect(c);
}

int main(void) {
  const char *both[] = {"direct", "proxy"};
  for (int i = 0; i < 2; i++) RUN("server", both[i], server(both[i], &out_));
  amqp_field_value_t none = {0};
  delayed_case cases[] = {
      {"delay_int", "dx", "k", field_i32(DELAY_INT), DELAY_INT},
      {"delay_string", "dx", "k", field_str(DELAY_STRING), 350},
      {"delay_float", "dx", "k", field_f64(DELAY_FLOAT), 400},
      {"delay_zero", "dx", "k", field_i32(0), 0},
      {"delay_missing", "dx", "k", none, 0},
      {"delay_topic_unroutable", "dt", "b.c", field_i32(DELAY_TOPIC), -1},
      {"delay_topic", "dt", "a.b.c", field_i32(DELAY_TOPIC), DELAY_TOPIC},
  };
  delayed("proxy", cases, sizeof cases / sizeof cases[0], 1);
  delayed_case int32[] = {{"delay_int", "dx", "k", field_i32(DELAY_INT32), DELAY_INT32}};
  delayed("proxy32", int32, 1, 0);
  for (int i = 0; i < 2; i++) plain(both[i]);
  cleanup("proxy");
  cleanup("proxy32");
  return 0;
}
