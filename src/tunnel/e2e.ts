/**
 * End-to-end streams: the wire contract between the client (gwsh), the Proxy and the agent. docs/tunnels.md
 * ("End-to-end streams") is the prose; this file is what each end builds and checks.
 *
 *   client ──"GWE2E1 <grant>\n", then TLS 1.3 (ALPN gateway-e2e-v1, server name <grant id>.e2e.gateway.invalid)──► agent
 *            │ raw TCP to the Proxy's one port              │ the Proxy splices raw bytes │ a data connection the
 *            │ (any Proxy of the cluster: a load balancer)  ▼                             │ agent dialled out (GWDATA1)
 *
 * 1. Grant. The client asks the Proxy for a grant on a grant session: TLS to the Proxy with the user certificate,
 *    ALPN `gateway-grant-v1`, JSON lines (GrantRequest → GrantAnswer). The Proxy authorizes the route exactly as
 *    it authorizes a classic route (identity, locks, the resource, roles) and signs an E2EGrant with its own host
 *    key (ECDSA P-256, SHA-256): short-lived (GRANT_TTL_MS), single-use, naming the user, the SHA-256 of the
 *    user's certificate public key, the resource and the agent's host ID, and carrying the Proxy's own certificate
 *    (x5c). The Proxy keeps nothing of it.
 * 2. Stream. The client opens a raw TCP connection to the Proxy's one port, writes the stream line
 *    `GWE2E1 <grant token>\n` (e2eLine) and starts TLS with the *agent*: ALPN E2E_ALPN, server name
 *    e2eServerName(grant id), its user certificate as client certificate; it verifies the agent's certificate
 *    against the cluster's host CA, requires the host ID the grant answer named and the service's system role.
 *    Whichever Proxy the connection lands on (behind a load balancer, most often not the grant's) routes it by
 *    the line: it checks the grant by itself (its x5c chains to the host CA and names a live Proxy, grant.iss; the
 *    signature; not expired; not routed by it before) and splices the bytes onto a data connection of the agent,
 *    after telling the agent on the tunnel's control stream (E2EOpenMessage) which data connection carries which
 *    grant. The token is no secret: it opens nothing without the user's key, and the agent takes it once.
 * 3. Data connections. An agent with v2 tunnels keeps `pool` idle data connections per tunnel, dialled like the
 *    tunnel (through HTTPS_PROXY) to the address the tunnel dialled. Each begins with one line, `GWDATA1 <n>
 *    <kid>:<mac>...\n`: n is the agent process's counter (never used twice), and there is one pair per v2 tunnel
 *    the agent holds through that address (behind a load balancer, one per Proxy there; at most
 *    DATA_TUNNELS_MAX); kid and mac come from that tunnel's TLS keying material (RFC 5705 exporter), so only the
 *    agent at the other end of a tunnel can make its pair. The Proxy the connection lands on takes the pair of one
 *    of its own tunnels and answers one line, `GWDATA1 ok <its host ID>\n` (or `GWDATA1 no <reason>\n` and the
 *    end), so the agent knows where the connection waits: only that Proxy may assign it. Then the connection
 *    carries nothing until the Proxy assigns it, and after that the Proxy relays bytes both ways untouched: the
 *    TLS records between client and agent.
 *    When none waits at the Proxy the stream reached (a Proxy the balancer has sent none to yet, one that just
 *    joined, a balancer that sends them all to one Proxy) and the agent's hello said e2e.stream, the Proxy opens a
 *    stream of the agent's tunnel instead, whose first line is the E2EOpenMessage with conn E2E_CONN_TUNNEL, and
 *    relays the same bytes on it: end to end all the same, at the tunnel's flow control rather than a connection
 *    of its own. An agent without e2e.stream: the Proxy waits up to DATA_WAIT_MS for a data connection.
 *    With Proxy peering, a Proxy that holds no tunnel of the agent relays the stream raw (plain TCP: no second
 *    layer) to the peering listener of the peer that does, the stream line first; that peer routes it as above and
 *    never relays it again. The grant is given for such an agent when its presence, written by that peer, carries
 *    the tunnel's capability (Presence.e2e) with `peered` (the agent checks a grant by its x5c).
 * 4. The agent takes the E2EOpenMessage (data connection n only if the Proxy's answer on n named the Proxy of the
 *    tunnel the message came on), checks the grant (signature by grant.iss, checked with the certificate of the
 *    agent's own tunnel to that Proxy, which need not be the tunnel the message came on, or with none, with the
 *    grant's x5c checked as the Proxies check it; its own host ID, a
 *    resource it serves, not expired, not used before), terminates the client's TLS with its host certificate, requires a user certificate of this cluster whose identity is the grant's user, whose
 *    public key is the grant's key and whose roles include the grant's roles, and checks its locks. Then it
 *    writes one DialAnswer line inside the TLS ({"ok":true} or the error) and relays the resource.
 *
 * Caps: a grant token at most GRANT_TOKEN_MAX_BYTES; a grant request or answer line at most GRANT_LINE_MAX_BYTES;
 * a stream line at most E2E_LINE_MAX_BYTES; a data preamble at most DATA_PREAMBLE_MAX_BYTES (DATA_TUNNELS_MAX
 * pairs); the Proxy's answer at most DATA_ANSWER_MAX_BYTES.
 */
import { createHash, createHmac, createPublicKey, sign, timingSafeEqual, verify, X509Certificate, type KeyObject } from 'node:crypto';
import type { TLSSocket } from 'node:tls';
import { badKubeAccess, type KubeAccess } from '../wire/kubeimpersonate.js';
import { DATA_MAGIC, E2E_MAGIC } from '../wire/protocols.js';
import type { DatabaseGrant, E2ECapability, ServiceKind } from './protocol.js';

export { E2E_ALPN, GRANT_ALPN, DATA_MAGIC, E2E_MAGIC } from '../wire/protocols.js';
/** The RFC 5705 exporter label both ends of a v2 tunnel derive the data connections' key with. */
export const DATA_EXPORTER_LABEL = 'EXPORTER-gateway-e2e-data';
export const DATA_KEY_BYTES = 32;

/** A grant is good for this long after it is issued: the client uses it at once. */
export const GRANT_TTL_MS = 30_000;
/** How far ahead of the checker's clock a grant's issue time may be (the Proxy's clock against the agent's). */
export const GRANT_CLOCK_SKEW_MS = 60_000;
export const GRANT_TOKEN_MAX_BYTES = 8 * 1024;
export const GRANT_LINE_MAX_BYTES = 16 * 1024;
/** Grant requests in flight on one grant session. */
export const GRANT_SESSION_INFLIGHT_MAX = 16;
/** A grant session with no request for this long is closed by the Proxy. */
export const GRANT_SESSION_IDLE_MS = 5 * 60_000;

/**
 * A data preamble carries one pair per v2 tunnel the agent holds through the address it dials (behind a load
 * balancer, one per Proxy there): at most this many, and the preamble at most its fixed part and that many pairs.
 */
export const DATA_TUNNELS_MAX = 16;
export const DATA_PREAMBLE_MAX_BYTES = 8 + 16 + DATA_TUNNELS_MAX * (1 + 16 + 1 + 64) + 1;
/** The Proxy's answer line to a preamble, at most this long; the agent waits for it this long. */
export const DATA_ANSWER_MAX_BYTES = 256;
export const DATA_ANSWER_TIMEOUT_MS = 10_000;
/** A data connection must send its preamble within this long of its first byte's sniff. */
export const DATA_PREAMBLE_TIMEOUT_MS = 10_000;
/**
 * The agent's default count of idle data connections per tunnel, and the most a Proxy keeps for one tunnel (it
 * keeps min(2 × the agent's pool, DATA_POOL_MAX): the agent's pool and the spares a balancer sent it).
 */
export const DATA_POOL_DEFAULT = 2;
export const DATA_POOL_MAX = 8;
/**
 * An idle data connection is replaced by the agent after this long: load balancers and proxies commonly cut a
 * connection idle for 60 s, and an idle data connection carries no heartbeat.
 */
export const DATA_IDLE_MAX_MS = 45_000;
/** The Proxy waits this long for an idle data connection of the agent when none is there. */
export const DATA_WAIT_MS = 10_000;
/**
 * The conn of an E2EOpenMessage that is the first line of a tunnel stream (v2): that stream carries the client's
 * TLS with the agent, when no data connection of the agent waits at the Proxy and its hello said e2e.stream.
 */
export const E2E_CONN_TUNNEL = 0;

/** The agent waits this long, after a data connection's first byte, for the E2EOpenMessage that assigns it. */
export const DATA_OPEN_WAIT_MS = 10_000;

/** What a grant says: everything the agent needs to check the stream again. */
export interface E2EGrant {
  v: 1;
  /** 32 lowercase hex characters (16 random bytes). */
  id: string;
  /** The issuing Proxy's host ID. */
  iss: string;
  /** The user's name (the user certificate's identity). */
  sub: string;
  /** base64url SHA-256 of the user certificate's SubjectPublicKeyInfo (DER): spkiHash. */
  key: string;
  /** The roles the Proxy authorized with (the user certificate must carry each). */
  roles: string[];
  service: ServiceKind;
  /** Database, app, desktop or kube cluster name; for ssh, "<login>@<port>" as DialRequest.resource. */
  resource: string;
  /** The agent's host ID. */
  agent: string;
  /** Database users and names the roles allow now (service db), as DialRequest.db_access. */
  db_access?: DatabaseGrant;
  /**
   * Service kube (required there): the Kubernetes users and groups the roles allow now, as the Proxy's kube route
   * computes them; the agent impersonates from them (src/wire/kubeimpersonate.ts), as DialRequest.kube_access.
   */
  kube_access?: KubeAccess;
  /** Issued at and expires at, ms since the epoch (the Proxy's clock). */
  iat: number;
  exp: number;
  /**
   * The issuing Proxy's TLS certificate (DER, base64url): the key the grant is signed with. Any Proxy of the
   * cluster checks it (it chains to the host CA, names a live Proxy `iss`) and then the grant, so the stream may
   * land on another Proxy than the grant session did (behind a load balancer). The agent checks the grant with the
   * certificate of its own tunnel to `iss`, and with this one (checked the same way: src/auth/grantissuer.ts) when
   * it holds none (Proxy peering).
   */
  x5c?: string;
  /** The grant request's span (src/trace.ts), the stream's parent at the agent, whichever Proxy routes it. */
  traceparent?: string;
  tracestate?: string;
}

/** Client → Proxy on a grant session, one JSON line each. */
export interface GrantRequest {
  /** The client's number for the request; the answer carries it (answers may come in any order). */
  id: number;
  resource: string;
  /** The route the classic path would take: a database protocol's route, gateway-tcp, gateway-proxy-ssh, kube. */
  route: string;
  /** gateway-tcp: which kind of resource. */
  kind?: 'app' | 'desktop';
  /** gateway-proxy-ssh: the OS login. */
  login?: string;
  traceparent?: string;
  tracestate?: string;
}

/**
 * Proxy → client. `ok: true`: the grant, with the agent the stream goes to and the server name to send. `ok:
 * false` with `classic`: no end-to-end stream for this resource (its agent is of an earlier version, on another
 * Proxy, or has no data connection): the client uses the classic route, unless it requires end-to-end. `ok:
 * false` with `error`: refused, as the classic route would refuse it.
 */
export type GrantAnswer =
  | { id: number; ok: true; grant: string; agent: string; server_name: string; expires: number }
  | { id: number; ok: false; classic: true; reason: string }
  | { id: number; ok: false; error: { code: string; message: string; hint?: string } };

/**
 * Proxy → agent on the control stream (E2EOpenMessage: data connection `conn` now carries the stream of `grant`),
 * and the hello's capability (E2ECapability): declared in protocol.ts with the other control messages, whose file
 * this one imports.
 */
export type { E2ECapability, E2EOpenMessage } from './protocol.js';

/** The server name a client sends for a grant (the `.invalid` TLD: never a real host). */
export function e2eServerName(grantId: string): string {
  return `${grantId}.e2e.gateway.invalid`;
}

const GRANT_ID = /^[0-9a-f]{32}$/;
/** The grant id a server name carries, or undefined. */
export function grantIdOfServerName(serverName: string | undefined): string | undefined {
  if (!serverName) return undefined;
  const m = /^([0-9a-f]{32})\.e2e\.gateway\.invalid$/.exec(serverName);
  return m?.[1];
}

/** base64url SHA-256 of a certificate's SubjectPublicKeyInfo (DER). */
export function spkiHash(cert: X509Certificate | Buffer | string): string {
  const x = cert instanceof X509Certificate ? cert : new X509Certificate(cert);
  const spki = x.publicKey.export({ type: 'spki', format: 'der' });
  return createHash('sha256').update(spki).digest('base64url');
}

/** The token: base64url(JSON of the grant) "." base64url(ECDSA-SHA256 signature of the first part). */
export function signGrant(grant: E2EGrant, privateKey: KeyObject | string): string {
  const body = Buffer.from(JSON.stringify(grant)).toString('base64url');
  const sig = sign('sha256', Buffer.from(body), privateKey).toString('base64url');
  return `${body}.${sig}`;
}

export type GrantCheck = { ok: true; grant: E2EGrant } | { ok: false; why: string };

/** The grant's fields without checking its signature (the Proxy reading its own; a log). Bounded. */
export function decodeGrant(token: string): GrantCheck {
  if (typeof token !== 'string' || token.length > GRANT_TOKEN_MAX_BYTES) return { ok: false, why: 'the grant is not a string of at most 8 KiB' };
  const dot = token.indexOf('.');
  if (dot <= 0 || dot !== token.lastIndexOf('.')) return { ok: false, why: 'the grant is not two base64url parts' };
  let value: unknown;
  try {
    value = JSON.parse(Buffer.from(token.slice(0, dot), 'base64url').toString('utf8'));
  } catch {
    return { ok: false, why: 'the grant is not JSON' };
  }
  const why = badGrant(value);
  return why ? { ok: false, why } : { ok: true, grant: value as E2EGrant };
}

/**
 * Checks a token: its signature by `issuer` (the Proxy's certificate or public key), its fields, and its time
 * against `now` (expired, or issued too far ahead). Single use and the grant's binding are the caller's.
 */
export function verifyGrant(token: string, issuer: X509Certificate | KeyObject, now: number): GrantCheck {
  const decoded = decodeGrant(token);
  if (!decoded.ok) return decoded;
  const dot = token.indexOf('.');
  const key = issuer instanceof X509Certificate ? issuer.publicKey : issuer.type === 'public' ? issuer : createPublicKey(issuer);
  let good = false;
  try {
    good = verify('sha256', Buffer.from(token.slice(0, dot)), key, Buffer.from(token.slice(dot + 1), 'base64url'));
  } catch {
    good = false;
  }
  if (!good) return { ok: false, why: "the grant's signature is not the issuing Proxy's" };
  const g = decoded.grant;
  if (g.exp <= now) return { ok: false, why: 'the grant has expired' };
  if (g.iat > now + GRANT_CLOCK_SKEW_MS) return { ok: false, why: 'the grant is issued in the future (check the clocks)' };
  return decoded;
}

const SERVICES: readonly ServiceKind[] = ['ssh', 'db', 'app', 'desktop', 'kube'];
const str = (v: unknown, max: number) => typeof v === 'string' && v.length > 0 && v.length <= max && !/[\u0000-\u001f\u007f]/.test(v);

/** Why a decoded value is not an E2EGrant, or undefined. */
export function badGrant(v: unknown): string | undefined {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return 'the grant is not an object';
  const g = v as Record<string, unknown>;
  if (g.v !== 1) return 'the grant is not version 1';
  if (typeof g.id !== 'string' || !GRANT_ID.test(g.id)) return "the grant's id is not 32 hex characters";
  for (const f of ['iss', 'sub', 'key', 'resource', 'agent'] as const) if (!str(g[f], 1024)) return `the grant's ${f} is not a printable string`;
  if (!SERVICES.includes(g.service as ServiceKind)) return "the grant's service is not one the agents serve";
  if (!Array.isArray(g.roles) || g.roles.length > 256 || !g.roles.every((r) => str(r, 256))) return "the grant's roles are not a list of names";
  if (!Number.isSafeInteger(g.iat) || !Number.isSafeInteger(g.exp) || (g.exp as number) <= (g.iat as number)) return "the grant's times are not an interval";
  if (g.x5c !== undefined && (typeof g.x5c !== 'string' || !/^[A-Za-z0-9_-]{1,6000}$/.test(g.x5c))) return "the grant's x5c is not a base64url certificate";
  for (const f of ['traceparent', 'tracestate'] as const) if (g[f] !== undefined && !str(g[f], 512)) return `the grant's ${f} is not a printable string`;
  return badGrantKube(g);
}

/** A kube grant must say whom the agent may impersonate (without it the client's own headers would decide); others say nothing of it. */
function badGrantKube(g: Record<string, unknown>): string | undefined {
  if (g.service !== 'kube') return g.kube_access === undefined ? undefined : "the grant's kube_access is for a kube grant only";
  const why = badKubeAccess(g.kube_access);
  return why ? `the grant's kube_access ${why}` : undefined;
}

/**
 * The stream line: what a client's end-to-end stream starts with, ahead of its TLS, `GWE2E1 <grant token>\n`. The
 * token is no secret (it opens nothing without the user's key, which the agent checks, and the agent takes it once),
 * so it travels in clear as the grant's id did in the server name.
 */
export function e2eLine(token: string): Buffer {
  return Buffer.from(`${E2E_MAGIC}${token}\n`, 'latin1');
}

/** The stream line's cap: the magic, a token at its largest, the newline. */
export const E2E_LINE_MAX_BYTES = E2E_MAGIC.length + GRANT_TOKEN_MAX_BYTES + 1;
/** A stream must send its whole line within this long of being routed (as a data connection its preamble). */
export const E2E_LINE_TIMEOUT_MS = DATA_PREAMBLE_TIMEOUT_MS;

export type E2ELineParse = { kind: 'need-more' } | { kind: 'bad'; why: string } | { kind: 'ok'; token: string; length: number };

/**
 * Parses a stream's first bytes (pure, bounded: at most E2E_LINE_MAX_BYTES are looked at). `length` is what the
 * line took; the rest of the buffer is the client's TLS. The token's fields are verifyGrant's to check.
 */
export function parseE2ELine(buf: Buffer): E2ELineParse {
  const head = buf.subarray(0, E2E_LINE_MAX_BYTES);
  const magic = Buffer.from(E2E_MAGIC, 'latin1');
  const prefix = head.subarray(0, magic.length);
  if (!magic.subarray(0, prefix.length).equals(prefix)) return { kind: 'bad', why: `the stream does not start with "${E2E_MAGIC.trim()} "` };
  const nl = head.indexOf(0x0a);
  if (nl < 0) return head.length >= E2E_LINE_MAX_BYTES ? { kind: 'bad', why: `the stream line is longer than ${E2E_LINE_MAX_BYTES} bytes` } : { kind: 'need-more' };
  const token = head.subarray(magic.length, nl).toString('latin1');
  if (!/^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/.test(token)) return { kind: 'bad', why: 'the stream line is not "GWE2E1 <grant token>"' };
  return { kind: 'ok', token, length: nl + 1 };
}

/** The key both ends of a v2 tunnel derive for its data connections (the TLS session's exporter). */
export function dataKeyOf(tunnel: TLSSocket): Buffer {
  return tunnel.exportKeyingMaterial(DATA_KEY_BYTES, DATA_EXPORTER_LABEL, Buffer.from('v1'));
}

/** A data key's public id: the first 8 bytes of its SHA-256, hex. */
export function dataKeyId(key: Buffer): string {
  return createHash('sha256').update(key).digest('hex').slice(0, 16);
}

function dataMac(key: Buffer, n: number): string {
  return createHmac('sha256', key).update(`gateway-e2e-data ${n}`).digest('hex');
}

/** One tunnel's proof in a data preamble: its key's id and the MAC of the connection's number with its key. */
export interface DataPair {
  kid: string;
  mac: string;
}

/**
 * The preamble of data connection `n` (n ≥ 1, one counter per agent process, never reused): one `<kid>:<mac>` pair
 * per key, i.e. per v2 tunnel the agent holds through the address it dials (1 to DATA_TUNNELS_MAX), so that
 * whichever of those Proxies a load balancer sends it to finds its own tunnel's pair.
 */
export function dataPreamble(keys: readonly Buffer[], n: number): Buffer {
  if (keys.length < 1 || keys.length > DATA_TUNNELS_MAX) throw new RangeError(`a data preamble carries 1 to ${DATA_TUNNELS_MAX} keys, not ${keys.length}`);
  const pairs = keys.map((k) => `${dataKeyId(k)}:${dataMac(k, n)}`).join(' ');
  return Buffer.from(`${DATA_MAGIC}${n} ${pairs}\n`, 'latin1');
}

export interface DataPreamble {
  n: number;
  pairs: DataPair[];
  /** Bytes the preamble took (the rest of the buffer is the stream's). */
  length: number;
}

export type DataPreambleParse = { kind: 'need-more' } | { kind: 'bad'; why: string } | ({ kind: 'ok' } & DataPreamble);

const DATA_PAIR = /^([0-9a-f]{16}):([0-9a-f]{64})$/;

/**
 * Parses a data connection's first bytes, `GWDATA1 <n> <kid>:<mac>[ <kid>:<mac>]...\n` (pure, bounded: at most
 * DATA_PREAMBLE_MAX_BYTES are looked at, at most DATA_TUNNELS_MAX pairs taken).
 */
export function parseDataPreamble(buf: Buffer): DataPreambleParse {
  const head = buf.subarray(0, DATA_PREAMBLE_MAX_BYTES);
  const nl = head.indexOf(0x0a);
  if (nl < 0) return head.length >= DATA_PREAMBLE_MAX_BYTES ? { kind: 'bad', why: `the data preamble is longer than ${DATA_PREAMBLE_MAX_BYTES} bytes` } : { kind: 'need-more' };
  const line = head.subarray(0, nl).toString('latin1');
  const fields = line.startsWith(DATA_MAGIC) ? line.slice(DATA_MAGIC.length).split(' ') : [];
  if (fields.length < 2 || !/^[1-9][0-9]{0,15}$/.test(fields[0]!)) return { kind: 'bad', why: 'the data preamble is not "GWDATA1 <n> <kid>:<mac>..."' };
  if (fields.length - 1 > DATA_TUNNELS_MAX) return { kind: 'bad', why: `the data preamble carries more than ${DATA_TUNNELS_MAX} tunnels' pairs` };
  const n = Number(fields[0]);
  if (!Number.isSafeInteger(n)) return { kind: 'bad', why: "the data preamble's number is too large" };
  const pairs: DataPair[] = [];
  for (const f of fields.slice(1)) {
    const m = DATA_PAIR.exec(f);
    if (!m) return { kind: 'bad', why: 'a pair of the data preamble is not "<16 hex>:<64 hex>"' };
    pairs.push({ kid: m[1]!, mac: m[2]! });
  }
  return { kind: 'ok', n, pairs, length: nl + 1 };
}

/** The pair of a parsed preamble that `key` would make (its kid), if the preamble carries one. */
export function dataPairOf(key: Buffer, p: DataPreamble): DataPair | undefined {
  const kid = dataKeyId(key);
  return p.pairs.find((pair) => pair.kid === kid);
}

/** Whether a parsed preamble carries a pair made with `key` for its number (its kid, and a MAC that matches). */
export function checkDataPreamble(key: Buffer, p: DataPreamble): boolean {
  const pair = dataPairOf(key, p);
  if (!pair) return false;
  return timingSafeEqual(Buffer.from(dataMac(key, p.n), 'latin1'), Buffer.from(pair.mac, 'latin1'));
}

/** The Proxy's answer to a data preamble: `ok` with its host ID (the connection waits there), or `no` and why. */
export type DataAnswer = { ok: true; proxy: string } | { ok: false; reason: string };

const DATA_ANSWER_PROXY = /^[\x21-\x7e]{1,200}$/;
const DATA_ANSWER_REASON = /^[a-z][a-z-]{0,63}$/;

/** `GWDATA1 ok <host ID>\n` or `GWDATA1 no <reason>\n` (the reason one of the Proxy's refusal names). */
export function dataAnswer(a: DataAnswer): Buffer {
  if (a.ok && !DATA_ANSWER_PROXY.test(a.proxy)) throw new RangeError('a host ID in a data answer is printable ASCII without spaces, at most 200 characters');
  if (!a.ok && !DATA_ANSWER_REASON.test(a.reason)) throw new RangeError('a data answer\'s reason is a lowercase word');
  return Buffer.from(a.ok ? `${DATA_MAGIC}ok ${a.proxy}\n` : `${DATA_MAGIC}no ${a.reason}\n`, 'latin1');
}

export type DataAnswerParse = { kind: 'need-more' } | { kind: 'bad'; why: string } | ({ kind: 'answer'; length: number } & { answer: DataAnswer });

/** Parses the Proxy's answer line (pure, bounded: at most DATA_ANSWER_MAX_BYTES are looked at). */
export function parseDataAnswer(buf: Buffer): DataAnswerParse {
  const head = buf.subarray(0, DATA_ANSWER_MAX_BYTES);
  const nl = head.indexOf(0x0a);
  if (nl < 0) return head.length >= DATA_ANSWER_MAX_BYTES ? { kind: 'bad', why: `the data answer is longer than ${DATA_ANSWER_MAX_BYTES} bytes` } : { kind: 'need-more' };
  const m = /^GWDATA1 (ok|no) (\S+)$/.exec(head.subarray(0, nl).toString('latin1'));
  if (m?.[1] === 'ok' && DATA_ANSWER_PROXY.test(m[2]!)) return { kind: 'answer', length: nl + 1, answer: { ok: true, proxy: m[2]! } };
  if (m?.[1] === 'no' && DATA_ANSWER_REASON.test(m[2]!)) return { kind: 'answer', length: nl + 1, answer: { ok: false, reason: m[2]! } };
  return { kind: 'bad', why: 'the data answer is not "GWDATA1 ok <host ID>" or "GWDATA1 no <reason>"' };
}

/** Why a control message is not an E2EOpenMessage, or undefined. */
export function badE2EOpen(v: Record<string, unknown>, on: 'control' | 'tunnel-stream' = 'control'): string | undefined {
  if (on === 'tunnel-stream') {
    if (v.conn !== E2E_CONN_TUNNEL) return `conn is not ${E2E_CONN_TUNNEL} (the tunnel stream that carries it)`;
  } else if (!Number.isSafeInteger(v.conn) || (v.conn as number) < 1) return 'conn is not a data connection number';
  if (typeof v.grant !== 'string' || v.grant.length > GRANT_TOKEN_MAX_BYTES) return 'grant is not a token';
  if (!str(v.client_src, 256) || !str(v.client_dst, 256)) return 'client_src/client_dst are not addresses';
  return undefined;
}

/** The hello's e2e field, when it is one this version understands. */
export function e2eCapabilityOf(v: unknown): E2ECapability | undefined {
  if (typeof v !== 'object' || v === null) return undefined;
  const c = v as Record<string, unknown>;
  if (c.v !== 1 || !Number.isSafeInteger(c.pool) || (c.pool as number) < 1) return undefined;
  return {
    v: 1,
    pool: Math.min(c.pool as number, DATA_POOL_MAX),
    ...(c.kube === true ? { kube: true } : {}),
    ...(c.peered === true ? { peered: true } : {}),
    ...(c.stream === true ? { stream: true } : {}),
  };
}
