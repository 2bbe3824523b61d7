/**
 * A hand-made CONNECT through a proxy that authenticates the connection (NTLM, Negotiate), for the labs' tests
 * of the schemes in src/dial/ before the Dialer uses them: every request on ONE TCP connection (a second one
 * fails the test: the schemes are bound to it), each 407's body read off by its Content-Length, the scheme's
 * tokens sent as they come. Resolves with what happened; the socket, after a 200, is the tunnel.
 */
import net from 'node:net';
import type { ConnectionAuthScheme } from '../../src/dial/connauth.js';

export interface ConnectResult {
  /** Status of each answer, in order (e.g. [407, 200]). */
  statuses: number[];
  /** The Proxy-Authorization values sent, in order. */
  sent: string[];
  /** The tunnel after a final 200 (the caller ends it), else undefined (the socket is destroyed). */
  tunnel?: net.Socket;
  /** The error the scheme threw, if it stopped the exchange. */
  error?: unknown;
}

interface Head {
  status: number;
  headers: Array<[string, string]>;
}

/** Reads one response head, and then its body by Content-Length; `buffered` carries bytes across responses. */
function readResponse(socket: net.Socket, state: { buffered: Buffer }): Promise<Head> {
  return new Promise((resolve, reject) => {
    const onData = (d?: Buffer) => {
      if (d) state.buffered = Buffer.concat([state.buffered, d]);
      const end = state.buffered.indexOf('\r\n\r\n');
      if (end < 0) return;
      const lines = state.buffered.subarray(0, end).toString('latin1').split('\r\n');
      const headers = lines.slice(1).map((l): [string, string] => [l.slice(0, l.indexOf(':')).trim().toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]);
      const length = Number(headers.find(([k]) => k === 'content-length')?.[1] ?? 0);
      const status = Number(lines[0]!.split(' ')[1]);
      if (status !== 200 && state.buffered.length < end + 4 + length) return;
      state.buffered = state.buffered.subarray(end + 4 + (status === 200 ? 0 : length));
      cleanup();
      resolve({ status, headers });
    };
    const onClose = () => (cleanup(), reject(new Error('the proxy closed the connection')));
    const cleanup = () => {
      socket.off('data', onData);
      socket.off('close', onClose);
    };
    socket.on('data', onData);
    socket.on('close', onClose);
    onData();
  });
}

/** CONNECT `target` through `proxy`, answering each 407 with the scheme's next token, up to `maxRounds`. */
export async function connectWithScheme(proxy: { host: string; port: number }, target: string, scheme: ConnectionAuthScheme, maxRounds = 4): Promise<ConnectResult> {
  const socket = net.connect(proxy);
  socket.setTimeout(15_000, () => socket.destroy(new Error('the proxy did not answer in 15 s')));
  await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
  socket.on('error', () => {});
  const result: ConnectResult = { statuses: [], sent: [] };
  const state = { buffered: Buffer.alloc(0) };
  let authorization: string | undefined;
  try {
    authorization = await scheme.first();
    for (let round = 0; round < maxRounds; round++) {
      result.sent.push(authorization);
      socket.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: ${authorization}\r\nProxy-Connection: keep-alive\r\n\r\n`);
      const head = await readResponse(socket, state);
      result.statuses.push(head.status);
      if (head.status === 200) {
        socket.setTimeout(0);
        return { ...result, tunnel: socket };
      }
      if (head.status !== 407) break;
      const challenge = head.headers.find(([k, v]) => k === 'proxy-authenticate' && v.toLowerCase().startsWith(scheme.name.toLowerCase()));
      if (!challenge) break;
      authorization = await scheme.next(challenge[1]);
    }
  } catch (err) {
    result.error = err;
  }
  socket.destroy();
  return result;
}

/** Sends an HTTP GET through the tunnel and resolves with the whole answer (the server closes after it). */
export function getThroughTunnel(tunnel: net.Socket, hostPort: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let out = '';
    tunnel.on('data', (d: Buffer) => (out += d.toString()));
    tunnel.once('end', () => resolve(out));
    tunnel.once('error', reject);
    tunnel.write(`GET / HTTP/1.1\r\nHost: ${hostPort}\r\nConnection: close\r\n\r\n`);
  });
}
