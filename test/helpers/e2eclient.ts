/**
 * The far side of gwsh's end-to-end streams, written from the contract (src/tunnel/e2e.ts) for the client's tests:
 * one TLS port that, as the Proxy's one port does, answers grant sessions (ALPN gateway-grant-v1, the Proxy's host
 * certificate) and classic routes (gateway-tcp: route header, answer, echo), takes an end-to-end stream's line
 * (GWE2E1 <grant>, recorded in `lines`) and hands the ClientHello behind it, whose server name is the grant's, to an
 * "agent" (its host certificate chosen by the server name: SNICallback), which answers a
 * DialAnswer line and echoes. Each behaviour (how grants are answered, which certificate the agent presents, what
 * it answers) is the test's to set; every connection of each kind is counted.
 */
import { once } from 'node:events';
import { Duplex } from 'node:stream';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import tls from 'node:tls';
import { generateAuthority, generateKeyPair, issueTlsCert, type CertAuthority } from '../../src/auth/pki.js';
import type { Profile } from '../../src/client/profile.js';
import { readJsonLine, writeJsonLine } from '../../src/stream/lines.js';
import { LineSplitter } from '../../src/stream/splitter.js';
import { E2E_ALPN, e2eServerName, GRANT_ALPN, GRANT_TTL_MS, grantIdOfServerName, parseE2ELine, signGrant, type E2EGrant, type GrantRequest } from '../../src/tunnel/e2e.js';
import type { ServiceKind } from '../../src/tunnel/protocol.js';
import { makeClusterPki, type ClusterPki, type IssuedCert } from './members.js';

/** A name of the Proxy that is not loopback to the Dialer (so HTTPS_PROXY applies); a hosts file maps it for squid. */
export const PROXY_NAME = 'proxy.e2e.test';

export interface E2EPki {
  host: ClusterPki;
  /** Another cluster's host CA. */
  other: ClusterPki;
  userCa: CertAuthority;
  proxy: IssuedCert;
  user: IssuedCert;
  /** The Proxy's key signs grants (the client only reads them). */
  proxyKeyPem: string;
}

export async function makeE2EPki(): Promise<E2EPki> {
  const [host, other, userCa] = await Promise.all([makeClusterPki('test'), makeClusterPki('other'), generateAuthority('user', 'test')]);
  const proxy = await host.issue({ name: 'proxy-1', roles: ['proxy'], ips: ['127.0.0.1'], dns: ['localhost', PROXY_NAME] });
  const keys = generateKeyPair();
  const userPem = await issueTlsCert(userCa, { publicKeyPem: keys.publicKeyPem, identity: { kind: 'user', name: 'alice', cluster: 'test', roles: ['dev'] }, ttlMs: 3600_000, usage: 'client' });
  return { host, other, userCa, proxy, user: { certPem: userPem, keyPem: keys.privateKeyPem }, proxyKeyPem: generateKeyPair().privateKeyPem };
}

export function profileFor(pki: E2EPki, address: string): Profile {
  return {
    proxy: address,
    username: 'alice',
    cluster: 'test',
    valid_until: new Date(Date.now() + 3600_000).toISOString(),
    dir: '/nonexistent',
    key: pki.user.keyPem,
    cert: pki.user.certPem,
    sshCert: '',
    hostCa: pki.host.caPem,
    identity: { kind: 'user', name: 'alice', cluster: 'test', roles: ['dev'] },
  };
}

/** A grant answer's fields for agent, signed as a Proxy would sign it. */
export function grantAnswerFor(pki: E2EPki, id: number, agent: string, service: ServiceKind = 'app', resource = 'echo'): Record<string, unknown> {
  const gid = randomBytes(16).toString('hex');
  const now = Date.now();
  const grant: E2EGrant = { v: 1, id: gid, iss: 'proxy-1', sub: 'alice', key: 'k', roles: ['dev'], service, resource, agent, iat: now, exp: now + GRANT_TTL_MS };
  return { id, ok: true, grant: signGrant(grant, pki.proxyKeyPem), agent, server_name: e2eServerName(gid), expires: grant.exp };
}

export interface FakeProxy {
  address: string;
  server: tls.Server;
  /** Connections per kind: grant sessions, end-to-end streams, classic routes. */
  counts: { grant: number; e2e: number; classic: number };
  /** Grant requests received, in order. */
  requests: GrantRequest[];
  /** The grant tokens end-to-end streams' lines carried, in order. */
  lines: string[];
  close(): Promise<void>;
}

export interface FakeProxyOptions {
  /** The Proxy's ALPN list; default grant, e2e and gateway-tcp. */
  alpn?: string[];
  /** Answers one grant request (write lines on socket yourself; default: a grant for agent-1). */
  onGrant?: (req: GrantRequest, socket: tls.TLSSocket) => void;
  /** The agent's certificate for an end-to-end stream; undefined: the handshake is refused (before any certificate). */
  agentCert?: () => IssuedCert | undefined;
  /** The port's highest TLS version (the agent's too: version bounds are the first context's); default TLS 1.3. */
  maxVersion?: tls.SecureVersion;
  /** What the agent does once TLS is up; default: {"ok":true}, then echo. */
  onE2E?: (socket: tls.TLSSocket) => void;
}

/**
 * The socket as a stream that starts with `head` (what was read to look at it): a TLS server given a net.Socket
 * reads its handle directly and would miss bytes put back with unshift.
 */
function rejoined(s: net.Socket, head: Buffer): Duplex {
  const d = new Duplex({
    read: () => void s.resume(),
    write: (chunk: Buffer, _enc, cb) => void s.write(chunk, cb),
    final: (cb) => {
      s.end();
      cb();
    },
    destroy: (err, cb) => {
      s.destroy();
      cb(err);
    },
  });
  if (head.length > 0) d.push(head);
  s.on('data', (c: Buffer) => {
    if (!d.push(c)) s.pause();
  });
  s.on('end', () => d.push(null));
  s.on('close', () => d.destroy());
  return d;
}

/** The test's one port. */
export async function startFakeProxy(pki: E2EPki, options: FakeProxyOptions = {}): Promise<FakeProxy> {
  const counts = { grant: 0, e2e: 0, classic: 0 };
  const requests: GrantRequest[] = [];
  const sockets = new Set<net.Socket>();
  const server = tls.createServer({
    cert: pki.proxy.certPem,
    key: pki.proxy.keyPem,
    ca: [pki.userCa.tls.certPem],
    requestCert: true,
    rejectUnauthorized: false,
    ALPNProtocols: options.alpn ?? [GRANT_ALPN, E2E_ALPN, 'gateway-tcp'],
    ...(options.maxVersion ? { maxVersion: options.maxVersion } : {}),
    SNICallback: (name, cb) => {
      if (!grantIdOfServerName(name)) return cb(null, undefined);
      const cert = options.agentCert?.();
      if (!cert) return cb(new Error('no agent for this grant'));
      cb(null, tls.createSecureContext({ cert: cert.certPem, key: cert.keyPem, ca: pki.userCa.tls.certPem }));
    },
  });
  // The one port: an end-to-end stream's line is taken off (parseE2ELine) before the TLS server sees the rest.
  const lines: string[] = [];
  const front = net.createServer((s) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
    s.on('error', () => undefined);
    let buf = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      let rest = buf;
      if (buf[0] === 0x47) {
        const parsed = parseE2ELine(buf);
        if (parsed.kind === 'need-more') return;
        if (parsed.kind === 'bad') return void s.destroy();
        lines.push(parsed.token);
        rest = buf.subarray(parsed.length);
      }
      s.off('data', onData);
      server.emit('connection', rejoined(s, rest));
    };
    s.on('data', onData);
  });
  server.on('tlsClientError', () => undefined);
  server.on('secureConnection', (socket: tls.TLSSocket) => {
    socket.on('error', () => undefined);
    if (socket.alpnProtocol === GRANT_ALPN) {
      counts.grant++;
      const splitter = new LineSplitter(64 * 1024);
      socket.on('data', (chunk: Buffer) => {
        for (const line of splitter.lines(chunk)) {
          const req = JSON.parse(line.toString()) as GrantRequest;
          requests.push(req);
          if (options.onGrant) options.onGrant(req, socket);
          else writeJsonLine(socket, grantAnswerFor(pki, req.id, 'agent-1'));
        }
      });
    } else if (socket.alpnProtocol === E2E_ALPN) {
      counts.e2e++;
      if (options.onE2E) return options.onE2E(socket);
      writeJsonLine(socket, { ok: true });
      socket.pipe(socket);
    } else {
      counts.classic++;
      void readJsonLine(socket, { timeoutMs: 5000 }).then(
        () => {
          writeJsonLine(socket, { ok: true });
          socket.write('classic:');
          socket.pipe(socket);
        },
        () => socket.destroy(),
      );
    }
  });
  front.listen(0, '127.0.0.1');
  await once(front, 'listening');
  const address = `127.0.0.1:${(front.address() as net.AddressInfo).port}`;
  return {
    address,
    server,
    counts,
    requests,
    lines,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => front.close(resolve));
    },
  };
}
