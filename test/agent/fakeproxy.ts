/**
 * A fake Proxy for the agent's end of the reverse tunnel (test/agent/tunnel.test.ts, pool.test.ts): an HTTPS
 * server that answers /webapi/find and a plain ssh2 server that accepts the agent (host ID host-1) and hands each
 * control channel to the test, which plays the Proxy's side of the control protocol line by line. It can say
 * what no real Proxy says: that is what the hostile cases need.
 */
import { EventEmitter, once } from 'node:events';
import https from 'node:https';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import ssh2 from 'ssh2';
import type { Connection, ServerChannel } from 'ssh2';
import type { HostIdentity } from '../../src/agent/identity.js';
import { generateKeyPair, sshPrivateKeyPem } from '../../src/auth/pki.js';
import { writeJsonLine } from '../../src/stream/lines.js';
import { ControlDecoder } from '../../src/tunnel/control.js';
import { CONTROL_SUBSYSTEM, TUNNEL_BIND, type ControlMessage, type DialRequest } from '../../src/tunnel/protocol.js';
import { makeClusterPki } from '../helpers/members.js';
import type { TestPki } from '../helpers/tls.js';

/** One control channel the agent opened: what it sent so far, and a way to wait for more. */
export class ControlSession extends EventEmitter {
  readonly received: ControlMessage[] = [];
  closed = false;

  constructor(
    readonly conn: Connection,
    readonly channel: ServerChannel,
  ) {
    super();
    const decoder = new ControlDecoder();
    channel.on('data', (chunk: Buffer) => {
      for (const m of decoder.push(chunk)) {
        this.received.push(m);
        this.emit('message', m);
      }
    });
    conn.once('close', () => {
      this.closed = true;
      this.emit('gone');
    });
  }

  send(m: ControlMessage | Record<string, unknown>): void {
    writeJsonLine(this.channel, m);
  }

  /** The first message (already received or still to come) that matches. */
  async next<T extends ControlMessage['type']>(type: T, pred: (m: Extract<ControlMessage, { type: T }>) => boolean = () => true): Promise<Extract<ControlMessage, { type: T }>> {
    const match = (m: ControlMessage): m is Extract<ControlMessage, { type: T }> => m.type === type && pred(m as Extract<ControlMessage, { type: T }>);
    const found = this.received.find(match);
    if (found) return found;
    return new Promise((resolve) => {
      const on = (m: ControlMessage) => {
        if (!match(m)) return;
        this.off('message', on);
        resolve(m);
      };
      this.on('message', on);
    });
  }

  async gone(): Promise<void> {
    if (!this.closed) await once(this, 'gone');
  }
}

export class FakeProxy {
  readonly sessions: ControlSession[] = [];
  readonly arrivals = new EventEmitter();
  private ssh!: ssh2.Server;
  private web!: https.Server;
  readonly hostKey = generateKeyPair();
  webAddr = '';
  /** The host CA of the fake cluster: its web certificate is a Proxy's (host, role proxy), as agents require. */
  hostCa = '';

  /**
   * `announce`: /webapi/find says which Proxy holds the tunnel host key (tunnel_proxies), as Proxies of this
   * version do; then the agent records that ID, not the welcome's. Without it, a Proxy of an earlier version.
   */
  /**
   * `shape.tlsRouting`: /webapi/find says TLS routing on its web address (which knows no tunnel ALPN) with the
   * SSH server as a tunnel port beside it; `shape.unlisted`: the host key it lists is not the SSH server's.
   */
  constructor(
    private readonly announce?: { proxyId: string },
    private readonly shape: { tlsRouting?: boolean; unlisted?: boolean } = {},
  ) {}

  async start(_pki?: TestPki): Promise<void> {
    this.ssh = new ssh2.Server({ hostKeys: [sshPrivateKeyPem(this.hostKey.privateKeyPem)] }, (conn) => this.onConnection(conn));
    await new Promise<void>((resolve) => this.ssh.listen(0, '127.0.0.1', resolve));
    const tunnelAddr = `127.0.0.1:${(this.ssh.address() as net.AddressInfo).port}`;
    const cluster = await makeClusterPki('test');
    this.hostCa = cluster.caPem;
    const cert = await cluster.issue({ name: this.announce?.proxyId ?? 'proxy-1', roles: ['proxy'], ips: ['127.0.0.1'] });
    const listed = this.shape.unlisted ? generateKeyPair().sshPublicKey : this.hostKey.sshPublicKey;
    const find = {
      proxy: { tls_routing_enabled: this.shape.tlsRouting === true, ssh: { ssh_tunnel_public_addr: tunnelAddr, public_addr: '' } },
      cluster_name: 'test',
      tunnel_host_keys: [listed],
      ...(this.announce ? { tunnel_proxies: [{ proxy_id: this.announce.proxyId, host_key: this.hostKey.sshPublicKey }] } : {}),
    };
    this.web = https.createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
      res.writeHead(req.url === '/webapi/find' ? 200 : 404, { 'content-type': 'application/json' });
      res.end(JSON.stringify(req.url === '/webapi/find' ? find : { error: { code: 'GW_ERR_API_NOT_FOUND', message: 'no' } }));
    });
    await new Promise<void>((resolve) => this.web.listen(0, '127.0.0.1', resolve));
    this.webAddr = `127.0.0.1:${(this.web.address() as net.AddressInfo).port}`;
    find.proxy.ssh.public_addr = this.webAddr;
  }

  private onConnection(conn: Connection): void {
    conn.on('error', () => undefined);
    conn.on('authentication', (ctx) => (ctx.method === 'publickey' && ctx.username === 'host-1' ? ctx.accept() : ctx.reject(['publickey'])));
    conn.on('request', (accept, reject, name) => (name === 'tcpip-forward' ? accept?.() : reject?.()));
    conn.on('ready', () => {
      conn.on('session', (acceptSession) => {
        acceptSession().on('subsystem', (acceptSub, rejectSub, info) => {
          if (info.name !== CONTROL_SUBSYSTEM) return rejectSub?.();
          const session = new ControlSession(conn, acceptSub());
          this.sessions.push(session);
          this.arrivals.emit('session', session);
        });
      });
    });
  }

  /** Control session number n (0-based), now or when the agent opens it. */
  async session(n: number): Promise<ControlSession> {
    while (this.sessions.length <= n) await once(this.arrivals, 'session');
    return this.sessions[n]!;
  }

  /** A forwarded connection to the agent, as the Proxy opens one for a client. */
  forward(session: ControlSession, request: DialRequest): Promise<Duplex> {
    return new Promise((resolve, reject) =>
      session.conn.forwardOut(TUNNEL_BIND.addr, TUNNEL_BIND.port, '127.0.0.1', 50000, (err, channel) => {
        if (err) return reject(err);
        writeJsonLine(channel, request);
        resolve(channel);
      }),
    );
  }

  async stop(): Promise<void> {
    for (const s of this.sessions) s.conn.end();
    this.ssh.close();
    this.web.closeAllConnections();
    await new Promise((resolve) => this.web.close(resolve));
  }
}

/**
 * The identity of the agent the fake Proxy accepts (host-1 of cluster "test"), with server its web address and
 * hostCa the fake cluster's (FakeProxy.hostCa once started).
 */
export function fakeIdentity(cert: { certPem: string; keyPem: string }, server: string, hostCa: string): HostIdentity {
  return {
    hostId: 'host-1',
    cluster: 'test',
    roles: ['db'],
    nodename: 'node-1',
    server,
    joinedVia: 'proxy',
    key: cert.keyPem,
    cert: cert.certPem,
    sshCert: '',
    hostCa,
    userCa: '',
    sshUserCa: '',
    identity: { kind: 'host', name: 'host-1', cluster: 'test', roles: ['db'] },
  };
}
