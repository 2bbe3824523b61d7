/**
 * What an agent announces and how it reaches a resource when the Proxy forwards a connection
 * (src/agent/resources.ts): local TCP for databases, apps and desktops, TLS through the Dialer for Kubernetes.
 */
import { once } from 'node:events';
import { writeFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { agentResources, agentServices, appAddress, connectTcp, resourceConnector } from '../../src/agent/resources.js';
import { parseConfig, type GatewayConfig, type ServiceName } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { isGatewayError } from '../../src/errors.js';
import type { DialRequest } from '../../src/tunnel/protocol.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { codeOf } from '../helpers/errors.js';
import { startOtlpReceiver } from '../helpers/otlp.js';
import { startTracing, stopTracing } from '../../src/trace.js';

let pki: TestPki;
let otherPki: TestPki;
let echo: net.Server;
let kube: tls.Server;
let echoPort: number;
let kubePort: number;

beforeAll(async () => {
  [pki, otherPki] = await Promise.all([makeTestPki(), makeTestPki()]);
  const cert = await pki.serverCert({ names: ['kube.test'], ips: ['127.0.0.1'] });
  echo = net.createServer((s) => s.on('error', () => undefined).pipe(s)); // a relay that breaks resets it (an RST, not a FIN)
  kube = tls.createServer({ cert: cert.certPem, key: cert.keyPem }, (s) => s.end('kube api\n'));
  kube.on('tlsClientError', () => undefined);
  await Promise.all([new Promise<void>((r) => echo.listen(0, '127.0.0.1', r)), new Promise<void>((r) => kube.listen(0, '127.0.0.1', r))]);
  echoPort = (echo.address() as net.AddressInfo).port;
  kubePort = (kube.address() as net.AddressInfo).port;
  writeFileSync(join(pki.dir, 'kube-ca.pem'), pki.caPem);
  writeFileSync(join(otherPki.dir, 'kube-ca.pem'), otherPki.caPem);
});

afterAll(async () => {
  echo.close();
  kube.close();
  await pki.cleanup();
  await otherPki.cleanup();
});

function config(): GatewayConfig {
  return parseConfig(
    [
      'ssh_service:',
      '  labels: {role: web}',
      'db_service:',
      `  databases: [{name: pg, protocol: postgres, uri: "127.0.0.1:${echoPort}", labels: {env: test}}]`,
      'app_service:',
      `  apps: [{name: grafana, uri: "http://127.0.0.1:${echoPort}", public_addr: grafana.example.com}, {name: tcpapp, uri: "tcp://127.0.0.1:${echoPort}"}]`,
      'windows_desktop_service:',
      `  desktops: [{name: rdp, addr: "127.0.0.1:${echoPort}"}]`,
      'kube_service:',
      '  clusters:',
      `    - {name: good, api_server: "https://127.0.0.1:${kubePort}", ca_file: ${join(pki.dir, 'kube-ca.pem')}}`,
      `    - {name: foreign, api_server: "https://127.0.0.1:${kubePort}", ca_file: ${join(otherPki.dir, 'kube-ca.pem')}}`,
    ].join('\n'),
    'resources.test.yaml',
  );
}

const ALL: ServiceName[] = ['ssh_service', 'db_service', 'app_service', 'windows_desktop_service', 'kube_service'];
const request = (service: DialRequest['service'], resource: string): DialRequest => ({ service, resource, client_src: '127.0.0.1:1', client_dst: '127.0.0.1:2' });

async function roundTrip(stream: Duplex, text: string): Promise<string> {
  stream.write(text);
  const [data] = (await once(stream, 'data')) as [Buffer];
  stream.destroy();
  return data.toString();
}


describe('what an agent announces', () => {
  it('agentServices names the tunnel services of the agent roles, and nothing for the others', () => {
    expect(agentServices(['auth_service', 'ssh_service', 'db_service', 'proxy_service', 'kube_service'])).toEqual(['ssh', 'db', 'kube']);
  });

  it('agentResources lists the resources of the services that run, with their labels', () => {
    const r = agentResources(config(), ['db_service', 'app_service']);
    expect(r).toEqual({
      databases: [{ name: 'pg', protocol: 'postgres', labels: { env: 'test' } }],
      apps: [
        { name: 'grafana', kind: 'http', labels: {}, public_addr: 'grafana.example.com' },
        { name: 'tcpapp', kind: 'tcp', labels: {} },
      ],
      desktops: [],
      kube_clusters: [],
    });
    expect(agentResources(config(), ALL).node_labels).toEqual({ role: 'web' });
  });

  it('appAddress is the host and port of an app URI, with the scheme default port', () => {
    expect(appAddress('https://app.internal/x')).toEqual({ host: 'app.internal', port: 443 });
    expect(appAddress('http://[::1]:8080')).toEqual({ host: '::1', port: 8080 });
    expect(appAddress('tcp://10.0.0.5:22')).toEqual({ host: '10.0.0.5', port: 22 });
  });
});

describe('reaching a resource', () => {
  it('databases, apps and desktops by TCP on the agent’s own network', async () => {
    const connect = resourceConnector(config(), ALL, new Dialer({ env: {} }), 'test');
    expect(await roundTrip(await connect(request('db', 'pg')), 'db')).toBe('db');
    expect(await roundTrip(await connect(request('app', 'grafana')), 'app')).toBe('app');
    expect(await roundTrip(await connect(request('desktop', 'rdp')), 'rdp')).toBe('rdp');
  });

  it('a resource this agent does not serve, or whose service is not running here: GW_ERR_TUNNEL_NOT_FOUND', async () => {
    const connect = resourceConnector(config(), ['app_service'], new Dialer({ env: {} }), 'test');
    expect(await codeOf(connect(request('app', 'nope')))).toBe('GW_ERR_TUNNEL_NOT_FOUND');
    expect(await codeOf(connect(request('db', 'pg')))).toBe('GW_ERR_TUNNEL_NOT_FOUND');
    expect(await codeOf(connect(request('ssh', 'root@22')))).toBe('GW_ERR_TUNNEL_NOT_FOUND');
  });

  it("traced: the kube dial records the Dialer's plan (as gateway dial-plan prints it) on the agent's span", async () => {
    const receiver = await startOtlpReceiver();
    await startTracing({ url: receiver.url, sampleRatio: 1, headers: {}, serviceName: 'test' });
    try {
      const attributes: Record<string, unknown> = {};
      const connect = resourceConnector(config(), ALL, new Dialer({ env: {} }), 'test');
      const stream = await connect(request('kube', 'good'), { set: (a) => Object.assign(attributes, a) });
      stream.destroy();
      expect(attributes).toMatchObject({ 'gateway.dial.via': 'direct', 'gateway.dial.target': `127.0.0.1:${kubePort}`, 'gateway.dial.reason': expect.stringMatching(/./) });
    } finally {
      await stopTracing();
      await receiver.close();
    }
  });

  it('a Kubernetes API server over TLS through the Dialer, verified against its ca_file', async () => {
    const connect = resourceConnector(config(), ALL, new Dialer({ env: {} }), 'test');
    const stream = await connect(request('kube', 'good'));
    const [data] = (await once(stream, 'data')) as [Buffer];
    expect(data.toString()).toBe('kube api\n');
    stream.destroy();
  });

  it('a Kubernetes API server whose certificate is not from its ca_file is refused as untrusted', async () => {
    const connect = resourceConnector(config(), ALL, new Dialer({ env: {} }), 'test');
    expect(await codeOf(connect(request('kube', 'foreign')))).toBe('GW_ERR_CLIENT_UNTRUSTED');
  });

  it('connectTcp says which resource it could not reach and why', async () => {
    const closed = net.createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const port = (closed.address() as net.AddressInfo).port;
    await new Promise((r) => closed.close(r));
    const err = await connectTcp({ host: '127.0.0.1', port }, 5000, 'database "pg"').then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isGatewayError(err) && err.code).toBe('GW_ERR_TUNNEL_DIAL_FAILED');
    expect((err as Error).message).toBe(`database "pg" at 127.0.0.1:${port}: ECONNREFUSED`);
  });
});
