/**
 * The agent accepts a server as its Proxy only when the server's certificate chains to the cluster's host CA and
 * carries the role proxy, and records the Proxy ID that certificate names (or, on raw SSH, the ID /webapi/find
 * lists for the host key shown), never the welcome's claim (issue 23, "What was seen" 1 and 2):
 *
 *   - hostile: a rogue TLS server holding a real agent's host certificate (right CA, right name) on /webapi/find or
 *     on the tunnel port gets no hello and no tunnel: the agent reports GW_ERR_TLS_WRONG_ROLE;
 *   - hostile: a Proxy whose welcome claims another Proxy's ID (v2 over TLS, and raw SSH) is not recorded under
 *     that ID, is dropped (GW_ERR_TUNNEL_AUTH), and gets nothing served through the tunnel, not even a stream it
 *     opened right after the welcome;
 *   - a welcome naming the Proxy of the certificate brings the tunnel up under that ID, and streams are served.
 */
import { once } from 'node:events';
import https from 'node:https';
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { TunnelAgent } from '../../src/agent/tunnel.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { readJsonLine, writeJsonLine } from '../../src/stream/lines.js';
import { ControlDecoder } from '../../src/tunnel/control.js';
import { TUNNEL_ALPN_V1, TUNNEL_ALPN_V2, type ControlMessage, type DialAnswer, type DialRequest } from '../../src/tunnel/protocol.js';
import { TunnelSession, type TunnelStream } from '../../src/tunnel/session.js';
import { makeClusterPki, type ClusterPki, type IssuedCert } from '../helpers/members.js';
import { echoAgentOptions } from '../helpers/tunnelagent.js';
import { waitUntil } from '../helpers/wait.js';
import { FakeProxy, fakeIdentity } from './fakeproxy.js';

setRootLogger(createLogger({ level: 'silent' }));

let cluster: ClusterPki;
let agentCert: IssuedCert;
let proxyCert: IssuedCert;
let stolenCert: IssuedCert;
let echo: net.Server;
let resourceDials = 0;

beforeAll(async () => {
  cluster = await makeClusterPki('test');
  agentCert = await cluster.issue({ name: 'host-1', roles: ['db'], dns: ['node-1'] });
  proxyCert = await cluster.issue({ name: 'proxy-b', roles: ['proxy'], ips: ['127.0.0.1'] });
  // What the issue's attacker held: a real agent's host certificate that names the Proxy's address.
  stolenCert = await cluster.issue({ name: 'host-2', roles: ['node', 'app'], ips: ['127.0.0.1'] });
  echo = net.createServer((s) => s.pipe(s));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
});

afterAll(() => void echo.close());

const closers: Array<() => void> = [];
afterEach(() => {
  for (const close of closers.splice(0)) close();
});

const WELCOME = { type: 'welcome', heartbeatIntervalMs: 60_000, heartbeatCountMax: 3 } as const;
const DIAL: DialRequest = { service: 'db', resource: 'pg', client_src: '127.0.0.1:50000', client_dst: '127.0.0.1:443' };

function address(server: net.Server): string {
  return `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
}

/** An HTTPS server answering /webapi/find (TLS routing: the tunnel at tunnelAddr) with cert; counts requests. */
async function findServer(cert: IssuedCert, tunnelAddr: () => string): Promise<{ addr: string; requests: string[] }> {
  const requests: string[] = [];
  const server = https.createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    requests.push(req.url ?? '');
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ proxy: { tls_routing_enabled: true, ssh: { public_addr: tunnelAddr() } }, cluster_name: 'test' }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closers.push(() => {
    server.closeAllConnections();
    server.close();
  });
  return { addr: address(server), requests };
}

/**
 * A TLS server on the tunnel ALPNs with cert: counts the bytes agents send, and (v2) plays the Proxy's side: on
 * the hello it sends a welcome naming `claim`, then opens a stream asking for the database "pg".
 */
async function tunnelServer(cert: IssuedCert, claim: string): Promise<{ addr: string; bytes: () => number; closed: Promise<void>; answers: Promise<DialAnswer | 'closed'>[] }> {
  let bytes = 0;
  let markClosed!: () => void;
  const closed = new Promise<void>((resolve) => (markClosed = resolve));
  const answers: Promise<DialAnswer | 'closed'>[] = [];
  const server = tls.createServer({ cert: cert.certPem, key: cert.keyPem, ca: cluster.caPem, requestCert: true, rejectUnauthorized: false, ALPNProtocols: [TUNNEL_ALPN_V2, TUNNEL_ALPN_V1] }, (socket) => {
    socket.on('error', () => undefined);
    socket.on('data', (chunk: Buffer) => (bytes += chunk.length));
    socket.once('close', () => markClosed());
    const session = new TunnelSession(socket, { role: 'proxy' });
    const decoder = new ControlDecoder();
    session.control.on('data', (chunk: Buffer) => {
      for (const m of decoder.push(chunk) as ControlMessage[]) {
        if (m.type !== 'hello') continue;
        writeJsonLine(session.control, { ...WELCOME, proxyId: claim });
        const stream: TunnelStream = session.openStream();
        stream.on('error', () => undefined);
        writeJsonLine(stream, DIAL);
        answers.push(readJsonLine<DialAnswer>(stream, { what: 'dial answer', timeoutMs: 60_000 }).catch(() => 'closed' as const));
      }
    });
  });
  server.on('tlsClientError', () => markClosed());
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closers.push(() => server.close());
  return { addr: address(server), bytes: () => bytes, closed, answers };
}

function startAgent(server: string): { agent: TunnelAgent; failures: GatewayError[]; connected: string[] } {
  const agent = new TunnelAgent(
    echoAgentOptions(fakeIdentity(agentCert, server, cluster.caPem), echo, {
      connectResource: async () => {
        resourceDials++;
        return net.connect((echo.address() as net.AddressInfo).port, '127.0.0.1');
      },
      backoff: { firstMs: 20, maxMs: 50 },
    }),
  );
  const failures: GatewayError[] = [];
  const connected: string[] = [];
  agent.on('failure', (e: GatewayError) => failures.push(e));
  agent.on('connected', (id: string) => connected.push(id));
  closers.push(() => agent.stop());
  agent.start();
  return { agent, failures, connected };
}

async function nextFailure(agent: TunnelAgent, code: string): Promise<GatewayError> {
  for (;;) {
    const [e] = (await once(agent, 'failure')) as [GatewayError];
    if (e.code === code) return e;
  }
}

describe("a server that is not a Proxy (an agent's certificate)", () => {
  it("hostile: on /webapi/find, it gets no request: the agent refuses its certificate (GW_ERR_TLS_WRONG_ROLE)", async () => {
    const tunnel = await tunnelServer(stolenCert, 'proxy-b');
    const rogue = await findServer(stolenCert, () => tunnel.addr);
    const { agent, connected } = startAgent(rogue.addr);
    const e = await nextFailure(agent, 'GW_ERR_TLS_WRONG_ROLE');
    expect(e.message).toContain('roles node, app');
    await nextFailure(agent, 'GW_ERR_TLS_WRONG_ROLE'); // and again on the retry: it never gets further
    expect(rogue.requests).toEqual([]);
    expect(tunnel.bytes()).toBe(0);
    expect(connected).toEqual([]);
  });

  it('hostile: on the tunnel port (behind a real Proxy\'s /webapi/find), it gets no hello and no tunnel', async () => {
    const rogue = await tunnelServer(stolenCert, 'proxy-b');
    const find = await findServer(proxyCert, () => rogue.addr);
    const { agent, connected } = startAgent(find.addr);
    await nextFailure(agent, 'GW_ERR_TLS_WRONG_ROLE');
    await rogue.closed; // the agent dropped the connection: what it had sent has arrived
    expect(rogue.bytes()).toBe(0); // not a byte of the tunnel protocol: no hello, no resources, no events
    expect(rogue.answers).toEqual([]);
    expect(connected).toEqual([]);
    expect(agent.proxyId).toBeUndefined();
  });
});

describe("a Proxy whose welcome claims another Proxy's ID", () => {
  it('hostile (v2): the claim is not recorded, the tunnel is dropped, and the stream it opened after the welcome is not served', async () => {
    resourceDials = 0;
    const fake = await tunnelServer(proxyCert, 'proxy-a'); // its certificate says proxy-b
    const find = await findServer(proxyCert, () => fake.addr);
    const { agent, connected } = startAgent(find.addr);
    const e = await nextFailure(agent, 'GW_ERR_TUNNEL_AUTH');
    expect(e.details).toMatchObject({ verified: 'proxy-b', claimed: 'proxy-a' });
    expect(await fake.answers[0]).toBe('closed');
    expect(resourceDials).toBe(0);
    expect(connected).toEqual([]);
    expect(agent.proxyId).toBeUndefined();
  });

  it("a welcome naming the certificate's Proxy brings the tunnel up under that ID, and the stream is served", async () => {
    const real = await tunnelServer(proxyCert, 'proxy-b');
    const find = await findServer(proxyCert, () => real.addr);
    const { agent } = startAgent(find.addr);
    const [id] = (await once(agent, 'connected')) as [string];
    expect(id).toBe('proxy-b');
    expect(agent.proxyId).toBe('proxy-b');
    expect(await real.answers[0]).toEqual({ ok: true });
  });

  it('hostile (the ladder\'s tunnel-port rung beside TLS routing): raw SSH still refuses a host key /webapi/find does not list', async () => {
    const proxy = new FakeProxy({ proxyId: 'proxy-1' }, { tlsRouting: true, unlisted: true });
    await proxy.start();
    closers.push(() => void proxy.stop());
    const agent = new TunnelAgent(echoAgentOptions(fakeIdentity(agentCert, proxy.webAddr, proxy.hostCa), echo, { backoff: { firstMs: 20, maxMs: 50 } }));
    closers.push(() => agent.stop());
    const falls: string[] = [];
    agent.on('fall', (from: string, to: string) => falls.push(`${from} -> ${to}`));
    let sessions = 0;
    proxy.arrivals.on('session', () => sessions++);
    const refusals: GatewayError[] = [];
    agent.on('failure', (e: GatewayError) => {
      if (/Host denied \(verification failed\)/.test(e.message)) refusals.push(e);
    });
    agent.start();
    await waitUntil('the host key refused twice (the retry gets no further)', () => refusals.length >= 2);
    expect(falls[0]).toBe('alpn -> tunnel-port'); // the web address knows no tunnel ALPN: the next rung
    expect(sessions).toBe(0);
    expect(agent.getState()).not.toBe('connected');
  });

  it('hostile (raw SSH): the Proxy /webapi/find lists for the host key shown is recorded; a welcome claiming another is refused, and a stream opened before it is not served', async () => {
    resourceDials = 0;
    const proxy = new FakeProxy({ proxyId: 'proxy-1' });
    await proxy.start();
    closers.push(() => void proxy.stop());
    const agent = new TunnelAgent(echoAgentOptions(fakeIdentity(agentCert, proxy.webAddr, proxy.hostCa), echo, { connectResource: async () => (resourceDials++, net.connect((echo.address() as net.AddressInfo).port, '127.0.0.1')), backoff: { firstMs: 20, maxMs: 50 } }));
    closers.push(() => agent.stop());
    const connected: string[] = [];
    agent.on('connected', (id: string) => connected.push(id));
    agent.start();
    const liar = await proxy.session(0);
    await liar.next('hello');
    // A stream opened before the welcome waits for it; the lying welcome then closes it unserved.
    const channel = await proxy.forward(liar, DIAL);
    channel.on('error', () => undefined);
    const refused = nextFailure(agent, 'GW_ERR_TUNNEL_AUTH');
    liar.send({ ...WELCOME, proxyId: 'proxy-2' });
    expect((await refused).details).toMatchObject({ verified: 'proxy-1', claimed: 'proxy-2' });
    expect(await readJsonLine<DialAnswer>(channel).catch(() => 'closed')).toBe('closed');
    expect(resourceDials).toBe(0);
    expect(connected).toEqual([]);
    // The next tunnel, with an honest welcome, is recorded under the listed ID.
    const honest = await proxy.session(1);
    await honest.next('hello');
    const up = once(agent, 'connected');
    honest.send({ ...WELCOME, proxyId: 'proxy-1' });
    expect(await up).toEqual(['proxy-1']);
  });
});
