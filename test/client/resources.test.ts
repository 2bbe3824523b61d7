/**
 * gwsh's way to a resource (src/client/resources.ts) against a local TLS server standing in for the Proxy's
 * route: ALPN, the route header, the answer line, then the stream; and each way it can fail.
 */
import { once } from 'node:events';
import type net from 'node:net';
import tls from 'node:tls';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { openResource, resourceTlsContext, routeAddress, type ResourceTarget } from '../../src/client/resources.js';
import type { Profile } from '../../src/client/profile.js';
import { Dialer } from '../../src/dial/dialer.js';
import { isGatewayError } from '../../src/errors.js';
import type { PingResponse } from '../../src/wire/ping.js';
import { readJsonLine, writeJsonLine } from '../../src/stream/lines.js';
import { databaseRoute, DATABASE_PROTOCOLS, wireRowOfAlpn } from '../../src/wire/protocols.js';
import { makeClusterPki, type ClusterPki, type IssuedCert } from '../helpers/members.js';

let pki: ClusterPki;
let otherPki: ClusterPki;
let serverCert: IssuedCert;
let userCert: IssuedCert;

beforeAll(async () => {
  [pki, otherPki] = await Promise.all([makeClusterPki('test'), makeClusterPki('other')]);
  // The Proxy's certificate: the cluster's host CA, role proxy (what gwsh checks besides the chain and the name).
  serverCert = await pki.issue({ name: 'proxy-1', roles: ['proxy'], dns: ['proxy.test'], ips: ['127.0.0.1'] });
  userCert = await pki.issue({ name: 'alice', roles: ['access'], kind: 'user' });
});

const servers: tls.Server[] = [];
const sockets: tls.TLSSocket[] = [];
afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy();
  for (const s of servers.splice(0)) await new Promise((resolve) => s.close(resolve));
});

interface Seen {
  header: Record<string, unknown>;
  alpn: string | false | null;
  /** The CN of the client certificate the route was shown. */
  clientCert: string | undefined;
}

/** A TLS server that reads the route header, answers with `answer` and then echoes. */
async function fakeRoute(alpn: string[], answer: unknown, cert: IssuedCert = serverCert): Promise<{ address: string; seen: Promise<Seen>; closed: Promise<void> }> {
  let resolveSeen!: (s: Seen) => void;
  const seen = new Promise<Seen>((resolve) => (resolveSeen = resolve));
  let resolveClosed!: () => void;
  const closed = new Promise<void>((resolve) => (resolveClosed = resolve));
  const server = tls.createServer({ cert: cert.certPem, key: cert.keyPem, ca: pki.caPem, requestCert: true, rejectUnauthorized: false, ALPNProtocols: alpn }, (socket) => {
    socket.on('error', () => undefined);
    socket.once('close', () => resolveClosed());
    sockets.push(socket);
    void readJsonLine<Record<string, unknown>>(socket).then((header) => {
      resolveSeen({ header, alpn: socket.alpnProtocol, clientCert: String(socket.getPeerCertificate().subject?.CN) });
      writeJsonLine(socket, answer);
      socket.pipe(socket);
    });
  });
  server.on('tlsClientError', () => resolveClosed());
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { address: `127.0.0.1:${(server.address() as net.AddressInfo).port}`, seen, closed };
}

function profile(hostCa = pki.caPem): Profile {
  return {
    proxy: 'proxy.test:443',
    username: 'alice',
    cluster: 'test',
    valid_until: new Date(Date.now() + 3600_000).toISOString(),
    dir: '/nonexistent',
    key: userCert.keyPem,
    cert: userCert.certPem,
    sshCert: '',
    hostCa,
    identity: { kind: 'user', name: 'alice', cluster: 'test', roles: [] },
  };
}

const dialer = new Dialer({ env: {} });

async function errorOf(p: Promise<unknown>): Promise<{ code: string; message: string }> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!isGatewayError(err)) throw new Error(`expected a GatewayError, got ${String(err)}`);
  return { code: err.code, message: err.message };
}

describe('openResource', () => {
  it('speaks the route: its ALPN, the user certificate, one header line with the target; then the stream is the resource', async () => {
    const route = await fakeRoute(['gateway-postgres'], { ok: true });
    const target: ResourceTarget = { alpn: 'gateway-postgres', resource: 'main', login: 'alice', check: true };
    const stream = await openResource(profile(), route.address, target, dialer);
    expect(await route.seen).toEqual({ header: { resource: 'main', login: 'alice', check: true }, alpn: 'gateway-postgres', clientCert: 'alice' });
    stream.write('SELECT 1');
    const [echoed] = (await once(stream, 'data')) as [Buffer];
    expect(echoed.toString()).toBe('SELECT 1');
    stream.destroy();
  });

  it('puts the kind in the header for apps and desktops, and nothing that was not asked', async () => {
    const route = await fakeRoute(['gateway-tcp'], { ok: true });
    (await openResource(profile(), route.address, { alpn: 'gateway-tcp', resource: 'rdp-1', kind: 'desktop' }, dialer)).destroy();
    // framed: gwsh asks for frames that say the end (src/stream/framed.ts); a check asks for none (nothing flows).
    expect((await route.seen).header).toEqual({ resource: 'rdp-1', kind: 'desktop', framed: true });
  });

  it("a refusal from the Proxy is a GatewayError with the Proxy's code (or the tunnel dial code for one it does not know)", async () => {
    const known = await fakeRoute(['gateway-postgres'], { ok: false, error: { code: 'GW_ERR_TUNNEL_NOT_FOUND', message: 'no connected agent serves database "main"' } });
    expect(await errorOf(openResource(profile(), known.address, { alpn: 'gateway-postgres', resource: 'main' }, dialer))).toEqual({
      code: 'GW_ERR_TUNNEL_NOT_FOUND',
      message: 'no connected agent serves database "main"',
    });
    const unknown = await fakeRoute(['gateway-postgres'], { ok: false, error: { code: 'GW_ERR_FROM_THE_FUTURE', message: 'something new' } });
    expect((await errorOf(openResource(profile(), unknown.address, { alpn: 'gateway-postgres', resource: 'main' }, dialer))).code).toBe('GW_ERR_TUNNEL_DIAL_FAILED');
  });

  it('a Proxy that does not serve the protocol (no ALPN match) is GW_ERR_TUNNEL_NOT_FOUND naming it', async () => {
    const route = await fakeRoute(['http/1.1'], { ok: true });
    const e = await errorOf(openResource(profile(), route.address, { alpn: 'gateway-mysql', resource: 'main' }, dialer));
    expect(e.code).toBe('GW_ERR_TUNNEL_NOT_FOUND');
    expect(e.message).toContain(`the Proxy at ${route.address} does not serve gateway-mysql`);
  });

  it("a Proxy whose certificate is not from the profile's cluster CA is refused as untrusted", async () => {
    const route = await fakeRoute(['gateway-postgres'], { ok: true });
    const e = await errorOf(openResource(profile(otherPki.caPem), route.address, { alpn: 'gateway-postgres', resource: 'main' }, dialer));
    expect(e.code).toBe('GW_ERR_CLIENT_UNTRUSTED');
  });

  it("hostile: a server holding an agent's host certificate of the cluster, with the Proxy's name, is refused before the route header is sent", async () => {
    // What an agent that joined with public_addrs naming the Proxy held (issue 23): chain and name pass; the role does not.
    const agentCert = await pki.issue({ name: 'host-7', roles: ['node', 'db'], dns: ['proxy.test'], ips: ['127.0.0.1'] });
    for (const context of [undefined, resourceTlsContext(profile())]) {
      const rogue = await fakeRoute(['gateway-postgres'], { ok: true }, agentCert);
      let header: unknown;
      void rogue.seen.then((seen) => (header = seen.header));
      const e = await errorOf(openResource(profile(), rogue.address, { alpn: 'gateway-postgres', resource: 'main', login: 'alice' }, dialer, context));
      expect(e.code).toBe('GW_ERR_TLS_WRONG_ROLE');
      expect(e.message).toContain('roles node, db');
      await rogue.closed; // the client gave up on the connection: whatever it had written has arrived
      expect(header).toBeUndefined();
    }
  });

  it('one TLS context for many connections (gwsh proxy): the same route and certificate each time, and the same refusal of an untrusted Proxy', async () => {
    const context = resourceTlsContext(profile());
    for (const resource of ['first', 'second']) {
      const route = await fakeRoute(['gateway-tcp'], { ok: true });
      const stream = await openResource(profile(), route.address, { alpn: 'gateway-tcp', resource, kind: 'app' }, dialer, context);
      expect(await route.seen).toEqual({ header: { resource, kind: 'app', framed: true }, alpn: 'gateway-tcp', clientCert: 'alice' });
      stream.destroy();
    }
    const untrusted = resourceTlsContext(profile(otherPki.caPem));
    const route = await fakeRoute(['gateway-tcp'], { ok: true });
    const e = await errorOf(openResource(profile(otherPki.caPem), route.address, { alpn: 'gateway-tcp', resource: 'x', kind: 'app' }, dialer, untrusted));
    expect(e.code).toBe('GW_ERR_CLIENT_UNTRUSTED');
  });
});

describe('routeAddress', () => {
  const ping = (tlsRouting: boolean) =>
    ({ proxy: { tls_routing_enabled: tlsRouting, db: { postgres_public_addr: 'proxy.test:5432', mysql_public_addr: '', mongo_public_addr: 'proxy.test:27017' } } }) as unknown as PingResponse;

  it('with TLS routing every route goes to the web address', () => {
    expect(routeAddress(profile(), ping(true), 'gateway-postgres')).toBe('proxy.test:443');
  });

  it("with separate listeners a database goes to its protocol's port when the Proxy has one, anything else to the web address", () => {
    expect(routeAddress(profile(), ping(false), 'gateway-postgres')).toBe('proxy.test:5432');
    expect(routeAddress(profile(), ping(false), 'gateway-mongodb')).toBe('proxy.test:27017');
    expect(routeAddress(profile(), ping(false), 'gateway-mysql')).toBe('proxy.test:443');
    expect(routeAddress(profile(), ping(false), 'gateway-tcp')).toBe('proxy.test:443');
  });

  it("every database route of the table goes to its row's ping field (Redis too), its -ping variant as well", () => {
    const db = Object.fromEntries(DATABASE_PROTOCOLS.map((protocol, i) => [wireRowOfAlpn(databaseRoute(protocol))!.pingDb!.public, `proxy.test:${7000 + i}`]));
    const separate = { proxy: { tls_routing_enabled: false, db } } as unknown as PingResponse;
    DATABASE_PROTOCOLS.forEach((protocol, i) => {
      expect(routeAddress(profile(), separate, databaseRoute(protocol))).toBe(`proxy.test:${7000 + i}`);
      expect(routeAddress(profile(), separate, `${databaseRoute(protocol)}-ping`)).toBe(`proxy.test:${7000 + i}`);
    });
    expect(routeAddress(profile(), separate, 'gateway-redis')).toBe(db.redis_public_addr);
    // A Proxy of an earlier version has no redis_public_addr: the web address, as before.
    expect(routeAddress(profile(), ping(false), 'gateway-redis')).toBe('proxy.test:443');
  });
});
