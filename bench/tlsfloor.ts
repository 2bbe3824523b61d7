/**
 * The floor under "Proxy memory per idle agent": what a bare Node.js TLS server (nothing of the gateway in it) holds
 * per idle connection, measured in the same run with the cluster's own certificates, so that the gateway's figure
 * can be read against what any Node.js process pays for one TLS connection.
 *
 *   mtls   the server asks for a client certificate and the client sends one (an agent's host certificate): what a
 *          tunnel over TLS with client-certificate authentication costs at the least
 *   tls    the same server and client, without a client certificate: what OpenSSL keeps for the peer's
 *          certificate and its verified chain is the difference
 *   mtls without tickets   mtls with SSL_OP_NO_TICKET on the server (as the Proxy's tunnel route has it): a TLS 1.3
 *          server sends its session tickets after the handshake, and Node's output BIO keeps the 16 KiB buffer that
 *          write took for the connection's life (heaptrack: NodeBIO::Write from the ticket, docs/tunnels.md)
 *
 * Server and clients run in two child processes started with the open-file limit raised to the hard one, the
 * server with --expose-gc; the figure is the server's VmRSS growth (after gc) divided by the connections.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface TlsFloorInput {
  /** The server's certificate and key (PEM), e.g. a host certificate of the cluster. */
  serverCert: string;
  serverKey: string;
  /** The CA the server trusts for client certificates (PEM). */
  ca: string;
  /** The client's certificate and key (PEM): an agent's host identity. */
  clientCert: string;
  clientKey: string;
  connections: number;
}

export interface TlsFloor {
  /** KiB of server VmRSS per idle connection, with a client certificate. */
  mtlsKiB: number;
  /** The same without one. */
  tlsKiB: number;
  /** With a client certificate, the server sending no session tickets. */
  mtlsNoTicketKiB: number;
  connections: number;
}

const CHILD = `
import tls from 'node:tls';
import { constants } from 'node:crypto';
const send = (m) => process.send(m);
const rssKiB = () => { globalThis.gc?.(); return process.memoryUsage().rss / 1024; };
process.once('message', async (m) => {
  if (m.role === 'server') {
    const held = [];
    const server = tls.createServer({ key: m.key, cert: m.cert, ca: m.ca, requestCert: m.requestCert, rejectUnauthorized: false, ...(m.noTicket ? { secureOptions: constants.SSL_OP_NO_TICKET } : {}) }, (s) => { held.push(s); s.on('error', () => {}); });
    server.listen(0, '127.0.0.1', () => send({ port: server.address().port }));
    process.on('message', (q) => { if (q === 'rss') setTimeout(() => send({ rss: rssKiB(), held: held.length }), 300); });
  } else {
    const opts = { host: '127.0.0.1', port: m.port, ca: m.ca, checkServerIdentity: () => undefined, ...(m.cert ? { cert: m.cert, key: m.key } : {}) };
    const conns = [];
    for (let i = 0; i < m.count; i += 50) {
      await Promise.all(Array.from({ length: Math.min(50, m.count - i) }, () => new Promise((resolve, reject) => {
        const s = tls.connect(opts, resolve); s.once('error', reject); conns.push(s);
      })));
    }
    send({ connected: conns.length });
  }
});
`;

function start(script: string, gc: boolean): ChildProcess {
  // ulimit through a shell: the child needs more descriptors than the usual soft limit of 1024 (up to the hard one).
  return fork(script, [], { execPath: '/bin/bash', execArgv: ['-c', `ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec "${process.execPath}" ${gc ? '--expose-gc' : ''} "$0"`], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
}

const next = <T>(child: ChildProcess): Promise<T> =>
  new Promise<T>((resolve, reject) => {
    child.once('message', (m) => resolve(m as T));
    child.once('exit', (code) => reject(new Error(`tls floor child exited (${code})`)));
  });

async function measure(script: string, input: TlsFloorInput, clientCert: boolean, noTicket = false): Promise<number> {
  const server = start(script, true);
  const client = start(script, false);
  try {
    const ready = next<{ port: number }>(server);
    server.send({ role: 'server', key: input.serverKey, cert: input.serverCert, ca: input.ca, requestCert: true, noTicket });
    const { port } = await ready;
    const rss = () => {
      const answer = next<{ rss: number; held: number }>(server);
      server.send('rss');
      return answer;
    };
    const before = await rss();
    const connected = next<{ connected: number }>(client);
    client.send({ role: 'client', port, ca: input.ca, count: input.connections, ...(clientCert ? { cert: input.clientCert, key: input.clientKey } : {}) });
    await connected;
    const after = await rss();
    return (after.rss - before.rss) / after.held;
  } finally {
    server.kill();
    client.kill();
  }
}

export async function measureTlsFloor(input: TlsFloorInput): Promise<TlsFloor> {
  const dir = await mkdtemp(join(tmpdir(), 'gw-tlsfloor-'));
  const script = join(dir, 'child.mjs');
  await writeFile(script, CHILD);
  try {
    const mtlsKiB = await measure(script, input, true);
    const tlsKiB = await measure(script, input, false);
    const mtlsNoTicketKiB = await measure(script, input, true, true);
    return { mtlsKiB, tlsKiB, mtlsNoTicketKiB, connections: input.connections };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
