import net from 'node:net';
import { once } from 'node:events';
import { TunnelSession } from './src/tunnel/session.js';
import { readControl } from './src/tunnel/control.js';
const N = Number(process.env.N ?? 2000);
const mode = process.env.MODE ?? 'session';
const gc = (globalThis as any).gc as () => void;
const server = net.createServer();
server.listen(0, '127.0.0.1');
await once(server, 'listening');
const port = (server.address() as net.AddressInfo).port;
const accepted: net.Socket[] = [];
server.on('connection', (s) => accepted.push(s));
const clients: net.Socket[] = [];
for (let i = 0; i < N; i++) { const c = net.connect(port, '127.0.0.1'); clients.push(c); await once(c, 'connect'); }
while (accepted.length < N) await new Promise((r) => setTimeout(r, 10));
gc(); gc();
const before = process.memoryUsage();
const keep: unknown[] = [];
for (let i = 0; i < N; i++) {
  if (mode === 'session') {
    const s = new TunnelSession(accepted[i]!, { role: 'proxy' });
    readControl(s.control, () => undefined, () => undefined);
    keep.push(s);
  } else if (mode === 'data') {
    accepted[i]!.on('data', () => undefined);
  }
}
await new Promise((r) => setTimeout(r, 200));
gc(); gc();
const after = process.memoryUsage();
console.log(mode, 'heap per session (bytes):', ((after.heapUsed - before.heapUsed) / N).toFixed(0), 'external:', ((after.external - before.external) / N).toFixed(0), 'rss:', ((after.rss - before.rss) / N).toFixed(0));
process.exit(0);
