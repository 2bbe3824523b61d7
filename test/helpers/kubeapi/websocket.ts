/**
 * WebSocket for the stand-in API server (the `ws` library), as the real API server serves kubectl 1.33's
 * defaults: exec over the channel protocols v5.channel.k8s.io / v4.channel.k8s.io (each binary message starts
 * with its channel: 0 stdin, 1 stdout, 2 stderr, 3 error = the Status JSON, 4 resize = {"Width","Height"}; v5 adds
 * 255 CLOSE, [255, 0] = the client closed stdin), and port-forward as SPDY/3.1 tunnelled in binary messages
 * (subprotocol "SPDY/3.1+portforward.k8s.io", unwrapped here and served by spdy.ts).
 *
 * Bounds: a message over `maxPayload` closes the connection (ws's 1009); output waits for each message to be
 * written before reading more of the process (back-pressure); the process is killed when the client goes.
 */
import { PassThrough, Writable } from 'node:stream';
import { createWebSocketStream, type WebSocket } from 'ws';
import type { Pod } from './api.js';
import { endOutputs, runCommand } from './exec.js';
import { serveSpdyPortForward, type StreamLimits } from './spdy.js';
import type { Status } from './status.js';

export const EXEC_PROTOCOLS = ['v5.channel.k8s.io', 'v4.channel.k8s.io'];
export const PORTFORWARD_PROTOCOL = 'SPDY/3.1+portforward.k8s.io';

/** The protocol the real server picks: the first of its own list the client offered. */
export function pickProtocol(offered: Set<string>, path: string): string | false {
  if (path.endsWith('/portforward')) return offered.has(PORTFORWARD_PROTOCOL) ? PORTFORWARD_PROTOCOL : false;
  return EXEC_PROTOCOLS.find((p) => offered.has(p)) ?? false;
}

/** A channel's output: each write is done once ws has written its message (back-pressure, and the order endOutputs relies on). */
function channelWriter(ws: WebSocket, channel: number): Writable {
  const w = new Writable({
    write(chunk: Buffer, _enc, cb) {
      if (ws.readyState !== ws.OPEN) return cb();
      ws.send(Buffer.concat([Buffer.from([channel]), chunk]), (err) => cb(err ?? undefined));
    },
  });
  w.on('error', () => undefined); // a write after the end (a pty's last bytes) or to a gone client: dropped
  return w;
}

export interface WsExec {
  command: string[];
  tty: boolean;
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  cwd: string;
}

export function serveWsExec(ws: WebSocket, o: WsExec): void {
  const v5 = ws.protocol === 'v5.channel.k8s.io';
  const stdin = o.stdin ? new PassThrough() : undefined;
  let resize: (cols: number, rows: number) => void = () => undefined;
  ws.on('error', () => undefined);
  ws.on('message', (data: Buffer) => {
    const channel = data[0];
    const body = data.subarray(1);
    if (channel === 0) stdin?.write(body);
    else if (channel === 4) {
      try {
        const size = JSON.parse(body.toString('utf8')) as { Width?: number; Height?: number };
        if (size.Width && size.Height) resize(size.Width, size.Height);
      } catch { /* ignored, as the real server logs it */ }
    } else if (channel === 255 && v5 && body[0] === 0) stdin?.end();
  });
  const stdout = o.stdout ? channelWriter(ws, 1) : undefined;
  const stderr = o.stderr && !o.tty ? channelWriter(ws, 2) : undefined;
  const kill = runCommand({ command: o.command, tty: o.tty, cwd: o.cwd }, {
    stdin, stdout, stderr,
    onResize: (cb) => { resize = cb; },
    // The output, then the Status on channel 3, then the close: kubectl reads nothing after the close.
    finish: (status: Status) => endOutputs([stdout, stderr], () => {
      if (ws.readyState !== ws.OPEN) return;
      ws.send(Buffer.concat([Buffer.from([3]), Buffer.from(JSON.stringify(status))]), () => ws.close(1000));
    }),
  });
  ws.on('close', () => { stdin?.end(); kill(); });
}

export function serveWsPortForward(ws: WebSocket, pod: Pod, limits: StreamLimits): void {
  ws.on('error', () => undefined);
  const duplex = createWebSocketStream(ws);
  duplex.on('error', () => ws.terminate());
  serveSpdyPortForward(duplex, pod, limits);
}
