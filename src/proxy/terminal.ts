/**
 * The Web UI's terminal: `GET /webapi/terminal?node=&login=&cols=&rows=` upgraded to a WebSocket (subprotocol
 * `gateway-terminal`; the session's bearer as the subprotocol `bearer.<token>`, the cookie as always). The Proxy
 * is the SSH client, as gwsh's ssh is:
 *
 *   1. the web session is resolved (cookie + bearer, ProxyAuth.resolveWebSession), the Origin must be the page's;
 *   2. the node is looked up among the agents this Proxy reaches, the login must be one of the user's and the
 *      user's roles must allow the node's labels (the checks of access.ts for gateway-proxy-ssh);
 *   3. a key is generated for this terminal and the Auth Service certifies it (webSessionSshCert: principals =
 *      the user's logins, valid until the session ends, at most an hour);
 *   4. a stream to the node's SSH Service through the router (its tunnel, a peer's, or directly), SSH over it with
 *      that certificate, the node's host key checked against its host certificate (node_host_cert, signed by the
 *      cluster's host CA, naming the node), then a PTY and a shell. The SSH Service records the session's audit
 *      events (session.start / session.end) as for any SSH client.
 *
 * Messages: binary frames are terminal bytes both ways; text frames from the page are JSON {type: 'resize',
 * cols, rows}; text frames to the page are JSON {type: 'error', code, message, hint} or {type: 'exit', code,
 * signal?}. Bounds: a message is at most 64 KiB (a bigger one closes the socket, 1009), the checks and the SSH
 * handshake share the SSH handshake deadline, a terminal with no byte either way for the idle timeout is closed,
 * a web session holds at most MAX_TERMINALS_PER_SESSION at once, and output is paused while the WebSocket's
 * buffer holds more than OUTPUT_HIGH_WATER bytes (the node's shell then blocks on SSH's window). The terminal is
 * tracked in auth.sessions: a lock or the user's removal closes it; so does the end of the web session (its
 * expiry, and a sign-out, which a terminal sees within 15 s: it asks for its session again that often).
 */
import type http from 'node:http';
import { createPrivateKey } from 'node:crypto';
import type { Duplex } from 'node:stream';
import ssh2, { type ClientChannel, type ParsedKey, type PublicKeyAuthMethod } from 'ssh2';
import { WebSocketServer, type WebSocket } from 'ws';
import { generateKeyPair, parseSshCert, sshPrivateKeyPem, type Identity } from '../auth/pki.js';
import { blobFromLine, sshSign } from '../auth/pki/sshwire.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { canAccess } from '../auth/rbac.js';
import type { WebSessionView } from '../auth/websessions.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import { connectionOf, type LimitSettings } from '../net/deadlines.js';
import { clientAddress } from '../stream/meta.js';
import { startHop, traceContextOf, traceFields, withinHop } from '../trace.js';
import type { AgentSource } from './router.js';
import { findTarget, type Target } from './resources.js';
import { refuseUpgrade } from './webanswer.js';
import { checkOrigin, credentialsOf, type WebCredentials } from './webcredentials.js';

export const TERMINAL_PATH = '/webapi/terminal';
export const TERMINAL_PROTOCOL = 'gateway-terminal';
/** The largest WebSocket message either way (a paste of the page is split by it below this). */
export const TERMINAL_MAX_MESSAGE = 64 * 1024;
/** Output waits while the WebSocket buffers more than this for a page that does not read. */
export const OUTPUT_HIGH_WATER = 1024 * 1024;
export const MAX_TERMINALS_PER_SESSION = 32;
const MAX_DIMENSION = 1000;
const PING_MS = 30_000;

export interface TerminalServerOptions {
  auth: ProxyAuth;
  agents: AgentSource;
  limits: LimitSettings;
  clock?: () => number;
  /** How often an open terminal checks that its web session still exists (sign-out ends it). Default 15 s. */
  recheckMs?: number;
}

interface Request {
  node: string;
  login: string;
  cols: number;
  rows: number;
}

/** The query of a terminal request, checked: node and login names, a window of 1..1000 columns and rows. */
export function terminalRequest(url: string): Request {
  const q = new URLSearchParams(url.includes('?') ? url.slice(url.indexOf('?') + 1) : '');
  const name = (key: string) => {
    const v = q.get(key) ?? '';
    if (!/^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$/.test(v)) throw new GatewayError('GW_ERR_API_BAD_REQUEST', `"${key}" must be a node name or login, got ${JSON.stringify(v.slice(0, 64))}`, { hint: `Open ${TERMINAL_PATH}?node=<node>&login=<login>.` });
    return v;
  };
  const size = (key: string, dflt: number) => {
    const v = q.get(key);
    if (v === null || v === '') return dflt;
    const n = Number(v);
    if (!Number.isInteger(n) || n < 1 || n > MAX_DIMENSION) throw new GatewayError('GW_ERR_API_BAD_REQUEST', `"${key}" must be an integer from 1 to ${MAX_DIMENSION}`);
    return n;
  };
  return { node: name('node'), login: name('login'), cols: size('cols', 80), rows: size('rows', 24) };
}

/** The bearer among the offered subprotocols ("bearer.<token>"), and whether the terminal's own is offered. */
function protocolsOf(req: http.IncomingMessage): { bearer: string | undefined; terminal: boolean } {
  const offered = String(req.headers['sec-websocket-protocol'] ?? '').slice(0, 4096).split(',').map((s) => s.trim());
  const bearer = offered.find((p) => /^bearer\.[A-Za-z0-9_-]{1,256}$/.test(p))?.slice('bearer.'.length);
  return { bearer, terminal: offered.includes(TERMINAL_PROTOCOL) };
}

export class TerminalServer {
  private readonly log = logger('web-terminal');
  private readonly wss = new WebSocketServer({ noServer: true, maxPayload: TERMINAL_MAX_MESSAGE, perMessageDeflate: false, handleProtocols: (offered) => (offered.has(TERMINAL_PROTOCOL) ? TERMINAL_PROTOCOL : false) });
  /** Open (and opening) terminals per web session id. */
  private readonly perSession = new Map<string, number>();
  private readonly open = new Set<WebSocket>();

  constructor(private readonly options: TerminalServerOptions) {}

  upgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): boolean {
    if ((req.url ?? '/').split('?')[0] !== TERMINAL_PATH) return false;
    socket.on('error', () => socket.destroy());
    // The checks, the dial and the SSH handshake share the SSH handshake deadline.
    connectionOf(socket).enter('ssh-handshake', this.options.limits.sshHandshakeMs);
    let creds: WebCredentials;
    let request: Request;
    try {
      if ((req.headers.upgrade ?? '').toLowerCase() !== 'websocket') throw new GatewayError('GW_ERR_API_BAD_REQUEST', `${TERMINAL_PATH} is a WebSocket`, { hint: 'Send Upgrade: websocket.' });
      checkOrigin(req);
      const offered = protocolsOf(req);
      if (!offered.terminal) throw new GatewayError('GW_ERR_API_BAD_REQUEST', `the WebSocket subprotocols do not include ${TERMINAL_PROTOCOL}`, { hint: `Offer "${TERMINAL_PROTOCOL}" and "bearer.<token>".` });
      creds = credentialsOf(req, offered.bearer);
      request = terminalRequest(req.url ?? '/');
    } catch (err) {
      refuseUpgrade(socket, err);
      return true;
    }
    if (!this.reserve(creds.id)) {
      refuseUpgrade(socket, new GatewayError('GW_ERR_WEB_TERMINAL_LIMIT', `this web session already has ${MAX_TERMINALS_PER_SESSION} terminals open`));
      return true;
    }
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      this.unreserve(creds.id);
    };
    socket.once('close', release);
    this.options.auth.resolveWebSession(creds.id, creds.bearer).then(
      (session) => {
        if (socket.destroyed) return release();
        this.wss.handleUpgrade(req, socket, head, (ws) => {
          // What the page sends before the shell is up (keys, a resize) waits in the socket, not in memory here.
          ws.pause();
          // A protocol error (a message over the cap: 1009) closes the socket; ws reports it here.
          ws.on('error', (err) => this.log.info({ user: session.identity.name, err: err.message }, 'web terminal closed: WebSocket error'));
          this.open.add(ws);
          ws.once('close', () => {
            this.open.delete(ws);
            release();
          });
          void this.run(ws, req, socket, session, creds, request);
        });
      },
      (err: unknown) => {
        release();
        refuseUpgrade(socket, err);
      },
    );
    return true;
  }

  private reserve(id: string): boolean {
    const n = this.perSession.get(id) ?? 0;
    if (n >= MAX_TERMINALS_PER_SESSION) return false;
    this.perSession.set(id, n + 1);
    return true;
  }

  private unreserve(id: string): void {
    const n = (this.perSession.get(id) ?? 1) - 1;
    if (n <= 0) this.perSession.delete(id);
    else this.perSession.set(id, n);
  }

  /** After the upgrade: the access checks, then SSH; a failure is an error frame and the close. */
  private async run(ws: WebSocket, req: http.IncomingMessage, socket: Duplex, session: WebSessionView, creds: WebCredentials, request: Request): Promise<void> {
    const identity = session.identity;
    const client = clientAddress(req.socket);
    const what = `web terminal ${request.login}@${request.node} ${client.address}:${client.port}`;
    const untrack = this.options.auth.sessions.track(identity, what, (why) => {
      this.log.info({ user: identity.name, node: request.node, code: why.code }, 'web terminal closed: identity revoked');
      sendError(ws, why);
    });
    ws.once('close', untrack);
    const expires = typeof session.expiresAt === 'number' ? session.expiresAt : Date.parse(session.expiresAt);
    const left = Math.max(0, Math.min(expires - (this.options.clock ?? Date.now)(), 2 ** 31 - 1));
    const timer = Number.isFinite(left) ? setTimeout(() => sendError(ws, new GatewayError('GW_ERR_WEB_SESSION_EXPIRED', 'the web session ended while the terminal was open', { hint: 'Sign in again on the web page.' })), left) : undefined;
    timer?.unref();
    const recheck = setInterval(() => void this.recheck(ws, creds), this.options.recheckMs ?? 15_000);
    recheck.unref();
    // WebSocket pings keep L7 load balancers from closing a quiet terminal (they do not count as activity here).
    const ping = setInterval(() => ws.ping(), PING_MS);
    ping.unref();
    ws.once('close', () => {
      clearTimeout(timer);
      clearInterval(recheck);
      clearInterval(ping);
    });
    try {
      const target = await this.check(identity, request);
      const channel = await this.openShell(ws, req, creds, identity, target, request, `${client.address}:${client.port}`, `${req.socket.localAddress}:${req.socket.localPort}`);
      if (ws.readyState !== ws.OPEN) return void channel.close();
      this.log.info({ user: identity.name, node: target.agent.nodename, login: request.login, client: client.address }, 'web terminal opened');
      pump(ws, channel, connectionOf(socket), this.options.limits.idleMs);
    } catch (err) {
      const e = toGatewayError(err);
      this.log.info({ user: identity.name, node: request.node, login: request.login, code: e.code, err: e.message }, 'web terminal refused');
      sendError(ws, e);
    }
  }

  /** A signed-out (deleted) or expired web session ends its terminals; an Auth Service that cannot say keeps them. */
  private async recheck(ws: WebSocket, creds: WebCredentials): Promise<void> {
    try {
      await this.options.auth.resolveWebSession(creds.id, creds.bearer);
    } catch (err) {
      const e = toGatewayError(err);
      if (e.code.startsWith('GW_ERR_WEB_SESSION_') || e.code === 'GW_ERR_ACCESS_LOCKED' || e.code === 'GW_ERR_AUTH_IDENTITY_REVOKED') sendError(ws, e);
    }
  }

  /** The checks of gwsh ssh through the Proxy (access.ts): the node is reachable, the login allowed, the labels too. */
  private async check(identity: Identity, request: Request): Promise<Target> {
    const target = findTarget(this.options.agents.agents(), 'gateway-proxy-ssh', { resource: request.node });
    if (!target) {
      throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `no connected agent serves the node "${request.node}"`, { hint: 'The resources page lists the nodes you may reach; the agent may be offline.' });
    }
    if (!(identity.logins ?? []).includes(request.login)) {
      throw new GatewayError('GW_ERR_ACCESS_DENIED', `login "${request.login}" is not allowed for ${identity.name} (allowed: ${(identity.logins ?? []).join(', ') || 'none'})`, {
        hint: 'Ask for a role whose logins include it, then sign in again.',
      });
    }
    if (!canAccess(await this.options.auth.rolesOf(identity.roles), target.access, target.labels)) {
      throw new GatewayError('GW_ERR_ACCESS_DENIED', `your roles (${identity.roles.join(', ') || 'none'}) do not allow the node "${target.name}" (labels ${JSON.stringify(target.labels)})`, {
        hint: 'Ask for a role whose node_labels match these labels, then sign in again.',
      });
    }
    return target;
  }

  /** A key and certificate for this terminal, a stream to the node's SSH Service, SSH, a PTY and a shell. */
  private async openShell(ws: WebSocket, req: http.IncomingMessage, creds: WebCredentials, identity: Identity, target: Target, request: Request, clientSrc: string, clientDst: string): Promise<ClientChannel> {
    const keys = generateKeyPair();
    const { ssh_cert: cert } = await this.options.auth.webSessionSshCert(creds.id, creds.bearer, keys.sshPublicKey);
    const hostKey = this.hostKeyOf(target);
    // This hop's span: the WebSocket request's traceparent header (the browser's) gives the trace, not its
    // sampled flag; without one, a new trace starts here.
    const hop = startHop('proxy.web_terminal', {
      kind: 'server',
      parent: traceContextOf({ traceparent: req.headers.traceparent, tracestate: req.headers.tracestate }),
      attributes: { 'gateway.route': 'web-terminal', 'gateway.route.reason': `WebSocket ${TERMINAL_PATH}`, 'gateway.service': 'ssh', 'gateway.resource': target.agent.nodename, 'gateway.agent.host_id': target.agent.hostId },
    });
    const stream = await withinHop(hop, () =>
      this.options.agents.dial(target.agent.hostId, { service: 'ssh', resource: `${request.login}@${target.agent.nodename}`, client_src: clientSrc, client_dst: clientDst, user: identity.name, ...traceFields(hop.context) }),
    );
    const conn = new ssh2.Client();
    const method: PublicKeyAuthMethod = { type: 'publickey', username: request.login, key: certifiedKey(keys.privateKeyPem, cert) };
    ws.once('close', () => {
      conn.end();
      stream.destroy();
    });
    await new Promise<void>((resolve, reject) => {
      conn.once('ready', resolve);
      conn.once('error', (err) => reject(new GatewayError('GW_ERR_TUNNEL_AUTH', `SSH to "${target.agent.nodename}" as ${request.login} failed: ${err.message}`, { hint: 'The node refused the login (no such OS user, or the certificate), or its host key did not match its certificate.' })));
      conn.once('close', () => reject(new GatewayError('GW_ERR_TUNNEL_DOWN', `the node "${target.agent.nodename}" closed the connection`)));
      conn.connect({
        sock: stream as never,
        username: request.login,
        authHandler: [method],
        hostVerifier: (key: Buffer) => key.equals(hostKey),
        readyTimeout: this.options.limits.sshHandshakeMs,
        keepaliveInterval: 0,
      });
    });
    conn.on('error', () => undefined);
    return new Promise<ClientChannel>((resolve, reject) => {
      conn.shell({ term: 'xterm-256color', cols: request.cols, rows: request.rows }, (err, channel) => (err ? reject(new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `the node refused the shell: ${err.message}`)) : resolve(channel)));
    });
  }

  /** The node's host key as its host certificate certifies it (signed by the host CA, naming the node, valid now). */
  private hostKeyOf(target: Target): Buffer {
    const line = target.agent.resources.node_host_cert;
    const bad = (why: string) => new GatewayError('GW_ERR_TUNNEL_AUTH', `the host certificate of "${target.agent.nodename}" ${why}`, { hint: "The agent must present a host certificate of this cluster; it renews its own before they run out (its log says 'renewing the host certificates' and why one failed), and an agent whose certificate expired must join again." });
    if (!line) throw bad('is missing');
    const cert = parseSshCert(line, this.options.auth.host.ssh.publicKey);
    const now = (this.options.clock ?? Date.now)();
    if (cert.signedByCa !== true) throw bad('is not signed by the cluster\'s host CA');
    if (cert.certType !== 'host' || !(cert.principals.includes(target.agent.nodename) || cert.principals.includes(target.agent.hostId))) throw bad('does not name it');
    if (now < cert.validAfter || now >= cert.validBefore) throw bad('has expired');
    return blobFromLine(cert.publicKey).blob;
  }

  /** Ends every terminal (the Proxy stops). */
  close(): void {
    for (const ws of this.open) ws.terminate();
    this.wss.close();
  }
}

/**
 * The key ssh2 signs with, presenting the OpenSSH certificate: ssh2's client has no certificate support, so its
 * parsed key is wrapped to name the certificate's type and blob, and to sign with SSH's signature blob (the key's
 * own algorithm name and signature), which ssh2's server (the agents' SSH Service) unwraps from the request.
 */
function certifiedKey(privateKeyPem: string, certLine: string): ParsedKey {
  const base = ssh2.utils.parseKey(sshPrivateKeyPem(privateKeyPem));
  if (base instanceof Error) throw new GatewayError('GW_ERR_INTERNAL', `cannot load the terminal's key: ${base.message}`);
  const { type, blob } = blobFromLine(certLine);
  const key = createPrivateKey(privateKeyPem);
  return Object.create(base, {
    type: { value: type },
    getPublicSSH: { value: () => blob },
    sign: { value: (data: Buffer) => sshSign(key, data) },
  }) as ParsedKey;
}

function sendError(ws: WebSocket, err: GatewayError): void {
  if (ws.readyState !== ws.OPEN) return;
  ws.resume(); // the closing handshake reads the page's answer
  ws.send(JSON.stringify({ type: 'error', ...err.toJSON() }));
  ws.close(err.code === 'GW_ERR_ACCESS_DENIED' || err.code === 'GW_ERR_ACCESS_LOCKED' ? 1008 : 1011, err.code);
}

/**
 * Bytes both ways with back-pressure: output pauses while the WebSocket buffers more than OUTPUT_HIGH_WATER and
 * resumes when a send completes below half of it; input pauses the WebSocket while SSH's channel is full.
 */
function pump(ws: WebSocket, channel: ClientChannel, conn: ReturnType<typeof connectionOf>, idleMs: number): void {
  let last = Date.now();
  const active = () => (last = Date.now());
  const idle = { unless: (): boolean => (Date.now() - last < idleMs ? (conn.enter('ssh-idle', idleMs - (Date.now() - last), idle), true) : false) };
  conn.enter('ssh-idle', idleMs, idle);
  let paused = false;
  const sent = () => {
    if (paused && ws.bufferedAmount < OUTPUT_HIGH_WATER / 2) {
      paused = false;
      channel.resume();
    }
  };
  const out = (chunk: Buffer) => {
    active();
    ws.send(chunk, { binary: true }, sent);
    if (!paused && ws.bufferedAmount > OUTPUT_HIGH_WATER) {
      paused = true;
      channel.pause();
    }
  };
  channel.on('data', out);
  channel.stderr.on('data', out);
  channel.once('exit', (code: number | null, signal?: string) => {
    if (ws.readyState === ws.OPEN) ws.send(JSON.stringify({ type: 'exit', code, ...(signal ? { signal } : {}) }));
  });
  channel.once('close', () => ws.close(1000, 'exit'));
  ws.on('message', (data: Buffer, isBinary: boolean) => {
    active();
    if (isBinary) {
      if (!channel.write(data)) {
        ws.pause();
        channel.once('drain', () => ws.resume());
      }
      return;
    }
    let m: unknown;
    try {
      m = JSON.parse(data.toString('utf8'));
    } catch {
      return;
    }
    const r = m as { type?: unknown; cols?: unknown; rows?: unknown };
    const ok = (n: unknown): n is number => Number.isInteger(n) && (n as number) >= 1 && (n as number) <= MAX_DIMENSION;
    if (r.type === 'resize' && ok(r.cols) && ok(r.rows)) channel.setWindow(r.rows, r.cols, 0, 0);
  });
  ws.once('close', () => {
    conn.leave('ssh-idle');
    channel.close();
  });
  ws.resume();
}
