/**
 * The control channel's reading and liveness, for both ends (src/agent/tunnel.ts, src/proxy/tunnel.ts).
 *
 *   parseControlMessage  pure: one line → the message, or undefined for a line the receiver ignores: not a
 *                        JSON object, a type this version does not know (a newer peer may send more), or a
 *                        known type whose fields do not have the types protocol.ts declares. Never throws.
 *   ControlDecoder       pure and bounded: chunks → messages, through a LineSplitter capped at
 *                        CONTROL_MAX_LINE_BYTES; a longer line throws GW_ERR_TUNNEL_PROTOCOL (nothing else).
 *   readControl          a channel's 'data' through a decoder; on a line over the cap it stops reading and
 *                        reports the error once: the caller closes the tunnel.
 *   Heartbeat            every interval a heartbeat to the peer, unless the peer has been silent too long:
 *                        then onSilent, once, and no more beats. The silence is checked CHECKS_PER_INTERVAL
 *                        times per interval, so a dead peer is found within deadTunnelBoundMs of its last byte.
 */
import type { Readable } from 'node:stream';
import type { GatewayError } from '../errors.js';
import { LineSplitter } from '../stream/splitter.js';
import { badE2EOpen } from './e2e.js';
import { CONTROL_MAX_LINE_BYTES, HOST_CERT_MAX, LOCKS_MESSAGE_MAX_USERS, RENEW_KEY_MAX, type ControlMessage } from './protocol.js';

type Fields = Record<string, unknown>;

const isObject = (v: unknown): v is Fields => v !== null && typeof v === 'object' && !Array.isArray(v);
const isString = (v: unknown): v is string => typeof v === 'string';
const isNumber = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
const isPositive = (v: unknown): v is number => isNumber(v) && v > 0;

const isStrategy = (v: unknown): boolean =>
  isObject(v) && (v.type === 'agent_mesh' || (v.type === 'proxy_peering' && isPositive(v.agent_connection_count) && Number.isInteger(v.agent_connection_count)));

/** Per known type, whether a message's fields have the declared types. */
const VALID: Record<ControlMessage['type'], (m: Fields) => boolean> = {
  hello: (m) =>
    isNumber(m.version) &&
    isString(m.hostId) &&
    isString(m.nodename) &&
    Array.isArray(m.services) &&
    m.services.every(isString) &&
    isObject(m.resources) &&
    (m.holds === undefined || (Array.isArray(m.holds) && m.holds.every(isString))),
  heartbeat: (m) => isNumber(m.seq),
  'e2e-open': (m) => badE2EOpen(m) === undefined,
  locks: (m) => Array.isArray(m.users) && m.users.length <= LOCKS_MESSAGE_MAX_USERS && m.users.every((u) => isString(u) && u.length > 0 && u.length <= 1024) && (m.reason === undefined || (isString(m.reason) && m.reason.length <= 1024)) && (m.at === undefined || Number.isSafeInteger(m.at)),
  // Only its shape here: the Proxy checks every field and bound where it keeps it (checkAgentHealth, src/wire/autoupdate.ts),
  // so that a bad one is logged there (once per tunnel) rather than dropped unseen.
  health: (m) => isObject(m.health),
  welcome: (m) => isString(m.proxyId) && isPositive(m.heartbeatIntervalMs) && isPositive(m.heartbeatCountMax),
  discovery: (m) => Array.isArray(m.proxies) && m.proxies.every((p) => isObject(p) && isString(p.id) && isString(p.addr)) && (m.strategy === undefined || isStrategy(m.strategy)),
  reconnect: (m) => isString(m.reason),
  event: (m) => isObject(m.event),
  'maintenance-changed': () => true,
  duplicate: (m) => isString(m.proxyId),
  refused: () => true,
  'host-cert': (m) => isString(m.ssh_cert) && m.ssh_cert.length <= HOST_CERT_MAX,
  'presence-proof': (m) => isString(m.proxyId) && m.proxyId.length <= 256 && isString(m.time) && m.time.length <= 64 && isString(m.signature) && m.signature.length <= 1024,
  renew: (m) =>
    isNumber(m.id) &&
    isString(m.public_key) &&
    m.public_key.length <= RENEW_KEY_MAX &&
    (m.proof === undefined || (isObject(m.proof) && isString(m.proof.time) && m.proof.time.length <= 64 && isString(m.proof.signature) && m.proof.signature.length <= 1024)),
  renewal: (m) =>
    isNumber(m.id) &&
    ((isObject(m.certs) && isString(m.certs.tls_cert) && isString(m.certs.ssh_cert) && m.error === undefined) ||
      (isObject(m.error) && isString(m.error.code) && isString(m.error.message) && (m.error.hint === undefined || isString(m.error.hint)) && m.certs === undefined)),
};

function isControlMessage(value: unknown): value is ControlMessage {
  return isObject(value) && isString(value.type) && Object.hasOwn(VALID, value.type) && VALID[value.type as ControlMessage['type']](value);
}

export function parseControlMessage(line: Buffer | string): ControlMessage | undefined {
  let value: unknown;
  try {
    value = JSON.parse(typeof line === 'string' ? line : line.toString('utf8'));
  } catch {
    return undefined;
  }
  return isControlMessage(value) ? value : undefined;
}

export class ControlDecoder {
  private readonly splitter: LineSplitter;

  constructor(maxLineBytes = CONTROL_MAX_LINE_BYTES) {
    this.splitter = new LineSplitter(maxLineBytes, 'control line');
  }

  /** Bytes held of an unfinished line. */
  get pending(): number {
    return this.splitter.pending;
  }

  /** The messages chunk completes, in order; lines to ignore are left out. */
  push(chunk: Buffer): ControlMessage[] {
    const out: ControlMessage[] = [];
    for (const line of this.splitter.lines(chunk)) {
      const message = parseControlMessage(line);
      if (message) out.push(message);
    }
    return out;
  }
}

export function readControl(channel: Readable, onMessage: (m: ControlMessage) => void, onError: (err: GatewayError) => void, maxLineBytes?: number): void {
  const decoder = new ControlDecoder(maxLineBytes);
  const onData = (chunk: Buffer) => {
    let messages: ControlMessage[];
    try {
      messages = decoder.push(chunk);
    } catch (err) {
      channel.off('data', onData);
      onError(err as GatewayError); // the decoder throws nothing but its GatewayError
      return;
    }
    for (const m of messages) onMessage(m);
  };
  channel.on('data', onData);
}

/** How often per heartbeat interval each end checks the peer's silence (the Proxy's sweep, the agent's Heartbeat). */
export const CHECKS_PER_INTERVAL = 4;

/**
 * How long after the last byte heard from the peer (at the latest: after a silent cut of the path) each end of a
 * tunnel has found it dead and dropped the connection: the peer may be silent for interval x countMax (countMax
 * heartbeats missed in a row), and the silence is checked every interval / CHECKS_PER_INTERVAL. 15 s x 3 + 3.75 s
 * = 48.75 s with the defaults (docs/tunnels.md, "A dead tunnel").
 */
export function deadTunnelBoundMs(intervalMs: number, countMax: number): number {
  return intervalMs * countMax + intervalMs / CHECKS_PER_INTERVAL;
}

export interface HeartbeatOptions {
  send(seq: number): void;
  /** The peer has been silent for more than the allowed time (silentMs): drop the tunnel. */
  onSilent(silentMs: number): void;
  /** Let the process exit while the timer runs. */
  unref?: boolean;
}

export class Heartbeat {
  private timer: NodeJS.Timeout | undefined;
  private lastHeard = Date.now();
  private seq = 0;

  constructor(private readonly options: HeartbeatOptions) {}

  /** The peer is alive now. */
  heard(): void {
    this.lastHeard = Date.now();
  }

  /**
   * (Re)starts beating every intervalMs; the peer may be silent for silentAfterMs, checked CHECKS_PER_INTERVAL
   * times per interval. The sequence goes on.
   */
  start(intervalMs: number, silentAfterMs: number): void {
    this.stop();
    let tick = 0;
    this.timer = setInterval(() => {
      const silentMs = Date.now() - this.lastHeard;
      if (silentMs > silentAfterMs) {
        this.stop();
        this.options.onSilent(silentMs);
        return;
      }
      if (++tick % CHECKS_PER_INTERVAL === 0) this.options.send(++this.seq);
    }, intervalMs / CHECKS_PER_INTERVAL);
    if (this.options.unref) this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }
}
