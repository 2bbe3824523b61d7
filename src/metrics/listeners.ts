/**
 * Listener and route metrics: every guarded listener's connections (accepted, refused by reason, closed by a
 * deadline or a protocol cap, open) and bytes, and the one port's connections per route (routed, open, bytes).
 *
 * The listener names are the guards' (src/net/deadlines.ts ConnectionLimits.listener), the route names the rows of
 * the protocol table (src/wire/protocols.ts; a test checks that both lists below cover them), the reasons the
 * multiplexer's and the guards' (mapped here onto a few kinds an operator alerts on). A listener's recorder is
 * made once per guard and keeps its children: nothing is looked up per connection but the reason of a refusal.
 *
 * Bytes are read from the sockets (bytesRead, bytesWritten: the kernel's count of what crossed the listener, TLS
 * included), never counted per chunk: when a connection closes, and at each scrape for the connections still open
 * (flushers registered by the guards), so a tunnel that stays up for days still shows its traffic. A connection the
 * one port routed adds the same amounts to its route's bytes, from its routing on (what a scrape flushed while it
 * was still being detected, a few hundred bytes of hello, stays the listener's alone). Refusals have no route: a
 * refused connection is one no route took, so they are counted per listener only.
 */
import type { Counter, Gauge } from 'prom-client';
import { counter, gauge, metricsEnabled, OTHER } from './define.js';

/** The guards' names: the protocol table's separate listeners, the one port, the Auth API, peering, agents'. */
export const LISTENERS = [
  'web', 'ssh', 'tunnel', 'kube', 'mysql', 'postgres', 'mongo', 'redis', 'proxy-web', 'upgrade', 'auth', 'peer',
  'agent_ssh', 'agent_kube', 'agent_desktop',
] as const;

const DB_ROUTES = ['gateway-mysql', 'gateway-postgres', 'gateway-mongodb', 'gateway-redis'] as const;
/** The protocol table's route names, with the -ping route of those that answer pings. */
export const ROUTES = [
  'web', 'ssh', 'gateway-reversetunnel', 'kube', 'gateway-proxy-ssh', 'gateway-tcp', 'gateway-tcp-ping', 'http',
  'gateway-grant', 'gateway-e2e', 'gateway-data',
  ...DB_ROUTES, ...DB_ROUTES.map((r) => `${r}-ping`),
] as const;

/** Why a connection was closed before it was served. */
export const REFUSALS = ['cap', 'source_cap', 'alpn', 'proxy_header', 'bad_hello', 'unknown_protocol', 'not_served', 'too_large', 'deadline', 'closed_early'] as const;
export type Refusal = (typeof REFUSALS)[number];

/** The deadlines of src/net/deadlines.ts (Phase) and the protocol caps that close a connection (ProtocolCap). */
export const CLOSE_REASONS = [
  'detect', 'tls-handshake', 'http-headers', 'http-request', 'http-idle', 'route-header', 'ssh-handshake', 'ssh-idle',
  'peer-request', 'peer-idle', 'half-close', 'h2-rapid-reset', 'h2-flood', 'h2-invalid-frames', 'h2-protocol',
] as const;

const AREA = 'listeners';
const accepted = counter({ name: 'gateway_connections_accepted_total', help: 'Connections a listener admitted (under its caps).', area: AREA, labels: { listener: LISTENERS } });
const refused = counter({
  name: 'gateway_connections_refused_total',
  help: 'Connections closed before they were served, by reason (cap: the listener is full; source_cap: the client holds its share; alpn, proxy_header, bad_hello, unknown_protocol, not_served, too_large, deadline, closed_early: the one port could not route it).',
  area: AREA,
  labels: { listener: LISTENERS, reason: REFUSALS },
});
const closed = counter({
  name: 'gateway_connections_closed_total',
  help: 'Connections a listener closed because a deadline passed (the phase) or the client broke a protocol cap.',
  area: AREA,
  labels: { listener: LISTENERS, reason: CLOSE_REASONS },
});
const open = gauge({ name: 'gateway_connections_open', help: 'Connections open on a listener now.', area: AREA, labels: { listener: LISTENERS } });

const flushers = new Set<() => void>();
// At each scrape, the bytes of the connections still open.
const bytes = counter({
  name: 'gateway_connection_bytes_total',
  help: 'Bytes received and sent on a listener\'s connections (TCP payload, TLS included), counted at close and at each scrape.',
  area: AREA,
  labels: { listener: LISTENERS, direction: ['received', 'sent'] },
  collect: () => {
    for (const flush of flushers) flush();
  },
});

const routed = counter({ name: 'gateway_connections_routed_total', help: 'Connections the one port routed, by route (a row of the protocol table).', area: AREA, labels: { route: ROUTES } });
const routeOpen = gauge({ name: 'gateway_route_connections_open', help: 'Connections the one port routed that are open now, by route.', area: AREA, labels: { route: ROUTES } });
const routeBytes = counter({
  name: 'gateway_route_bytes_total',
  help: "Bytes received and sent on the connections of a route (the listener's socket counts from the routing on), counted at close and at each scrape.",
  area: AREA,
  labels: { route: ROUTES, direction: ['received', 'sent'] },
});

/** The multiplexer's refusal reasons (src/mux/multiplexer.ts, src/mux/trust.ts) as the kinds above. */
export function refusalKind(reason: string): Refusal {
  if (reason === 'no-application-protocol') return 'alpn';
  if (reason === 'bad-proxy-header' || reason.startsWith('proxy-protocol-')) return 'proxy_header';
  if (reason === 'bad-hello' || reason === 'hello-too-large') return 'bad_hello';
  if (reason === 'source-cap') return 'source_cap';
  if (reason === 'detect-timeout') return 'deadline';
  if (reason === 'too-large') return 'too_large';
  if (reason === 'unknown-protocol') return 'unknown_protocol';
  if (reason.endsWith('-not-served')) return 'not_served';
  return 'closed_early';
}

/** One listener's recorder, made once by its guard. */
export class ListenerMetrics {
  private readonly accepted: Counter.Internal;
  private readonly open: Gauge.Internal<string>;
  private readonly received: Counter.Internal;
  private readonly sent: Counter.Internal;

  constructor(readonly listener: string) {
    this.accepted = accepted.with({ listener });
    this.open = open.with({ listener });
    this.received = bytes.with({ listener, direction: 'received' });
    this.sent = bytes.with({ listener, direction: 'sent' });
  }

  admitted(): void {
    this.accepted.inc();
    this.open.inc();
  }

  released(): void {
    this.open.dec();
  }

  refused(reason: Refusal): void {
    refused.inc({ listener: this.listener, reason });
  }

  closed(reason: string): void {
    closed.inc({ listener: this.listener, reason });
  }

  /** Bytes moved since the last call for this connection. */
  bytes(received: number, sent: number): void {
    if (received > 0) this.received.inc(received);
    if (sent > 0) this.sent.inc(sent);
  }

  /** Called at each scrape (the guard adds its open connections' bytes); returns the function that stops it. */
  static onScrape(flush: () => void): () => void {
    flushers.add(flush);
    return () => flushers.delete(flush);
  }
}

/** One route's recorder: bound once per route name (the protocol table's, a closed set) and kept. */
export class RouteMetrics {
  private readonly routed: Counter.Internal;
  private readonly open: Gauge.Internal<string>;
  private readonly received: Counter.Internal;
  private readonly sent: Counter.Internal;

  constructor(route: string) {
    this.routed = routed.with({ route });
    this.open = routeOpen.with({ route });
    this.received = routeBytes.with({ route, direction: 'received' });
    this.sent = routeBytes.with({ route, direction: 'sent' });
  }

  admitted(): void {
    this.routed.inc();
    this.open.inc();
  }

  released(): void {
    this.open.dec();
  }

  bytes(received: number, sent: number): void {
    if (received > 0) this.received.inc(received);
    if (sent > 0) this.sent.inc(sent);
  }
}

const routeRecorders = new Map<string, RouteMetrics>();

/**
 * The one port routed a connection: its route's recorder, counted as routed and open (the connection releases it
 * when it closes). Unknown names share `other`'s recorder, so the map holds at most the table's rows.
 */
export function recordRouted(route: string): RouteMetrics {
  const name = (ROUTES as readonly string[]).includes(route) ? route : OTHER;
  let m = routeRecorders.get(name);
  if (!m) {
    m = new RouteMetrics(name);
    // Bound while recording is off, its children are no-ops: kept only once they count.
    if (metricsEnabled()) routeRecorders.set(name, m);
  }
  m.admitted();
  return m;
}
