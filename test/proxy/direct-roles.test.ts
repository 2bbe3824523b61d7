/**
 * A Proxy dialling a direct-join agent's listener (src/proxy/direct.ts) accepts the agent's certificate only when
 * it is the host certificate of the agent the presence names AND carries the system role of the service dialled
 * (ssh: node, kube: kube, desktop: desktop): a presence record says where a listener is, the certificate says what
 * its holder joined as (issue 23, "What to build" 1).
 *
 * hostile: an agent that joined as a Windows Desktop agent only, whose presence also advertises an SSH listener,
 * gets no SSH dial request (GW_ERR_DIRECT_AUTH before a byte of it is written); its desktop is dialled as before.
 * The listener is on this machine's first non-loopback IPv4 address: the Proxy never dials loopback.
 */
import { networkInterfaces } from 'node:os';
import type net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Presence } from '../../src/auth/records.js';
import { Dialer } from '../../src/dial/dialer.js';
import { checkAgentCert, dialDirect, type DirectDialDeps } from '../../src/proxy/direct.js';
import { readJsonLine, writeJsonLine } from '../../src/stream/lines.js';
import type { DialRequest } from '../../src/tunnel/protocol.js';
import { makeClusterPki, type ClusterPki } from '../helpers/members.js';

const HOST_IP = Object.values(networkInterfaces())
  .flat()
  .find((i) => i && i.family === 'IPv4' && !i.internal)?.address;

let cluster: ClusterPki;
let listener: tls.Server;
let deps: DirectDialDeps;
let presence: Presence;
/** The dial requests the agent's listener received. */
const requests: DialRequest[] = [];

beforeAll(async () => {
  if (!HOST_IP) throw new Error('this machine has no non-loopback IPv4 address: the Proxy never dials loopback, so there is nothing to dial');
  cluster = await makeClusterPki('direct.example');
  const agent = await cluster.issue({ name: 'h-1', roles: ['desktop'], ips: [HOST_IP] });
  const proxy = await cluster.issue({ name: 'proxy-1', roles: ['proxy'] });
  listener = tls.createServer({ cert: agent.certPem, key: agent.keyPem, ca: cluster.caPem, requestCert: true, rejectUnauthorized: true }, (socket) => {
    socket.on('error', () => undefined);
    void readJsonLine<DialRequest>(socket).then((r) => {
      requests.push(r);
      writeJsonLine(socket, { ok: true });
    }, () => undefined);
  });
  listener.on('tlsClientError', () => undefined);
  await new Promise<void>((resolve) => listener.listen(0, HOST_IP, resolve));
  const addr = `${HOST_IP}:${(listener.address() as net.AddressInfo).port}`;
  deps = { dialer: new Dialer({ env: {} }), cert: proxy.certPem, key: proxy.keyPem, hostCa: cluster.caPem, timeoutMs: 10_000 };
  const now = new Date().toISOString();
  presence = { hostId: 'h-1', nodename: 'win-1', proxyId: 'direct', services: ['desktop', 'ssh'], resources: { databases: [], apps: [], desktops: [], kube_clusters: [] }, connectedAt: now, lastHeartbeat: now, direct: { desktop: addr, ssh: addr, kube: addr } };
});

afterAll(() => void listener?.close());

const request = (service: DialRequest['service'], resource: string): DialRequest => ({ service, resource, client_src: '192.0.2.1:5000', client_dst: '192.0.2.2:443' });

describe("the direct-join agent's certificate must carry the role of the service dialled", () => {
  it('hostile: an agent joined for desktop only gets no SSH or Kubernetes dial request: GW_ERR_DIRECT_AUTH', async () => {
    for (const [service, role] of [['ssh', 'node'], ['kube', 'kube']] as const) {
      const err = await dialDirect(presence, request(service, 'x'), deps).then(() => undefined, (e: unknown) => e);
      expect(err).toMatchObject({ code: 'GW_ERR_DIRECT_AUTH' });
      expect((err as Error).message).toContain(`not ${role}`);
    }
    expect(requests).toEqual([]);
  });

  it('its desktop, the role it joined for, is dialled as before', async () => {
    const stream = await dialDirect(presence, request('desktop', 'win'), deps);
    stream.destroy();
    expect(requests.map((r) => [r.service, r.resource])).toEqual([['desktop', 'win']]);
  });

  it('checkAgentCert: the host ID first, then the role', async () => {
    const der = (pem: string) => ({ raw: Buffer.from(pem.replace(/-----[^-]+-----|\s/g, ''), 'base64') });
    const node = await cluster.issue({ name: 'h-2', roles: ['node'] });
    expect(checkAgentCert(der(node.certPem), 'h-2', 'ssh')).toBeUndefined();
    expect(checkAgentCert(der(node.certPem), 'h-2', 'desktop')?.message).toContain('not desktop');
    expect(checkAgentCert(der(node.certPem), 'h-3', 'ssh')?.message).toContain('not agent h-3');
  });
});
