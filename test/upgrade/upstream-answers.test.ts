/**
 * The upgraders' version clients (gateway-upgrade's fetchTarget, the Kubernetes updater's channelVersionSource)
 * against a version server that answers as upstream's does: a critical flag of "true" / "false", and "none" on
 * /version when it has no target (docs/version-server.md, "Upstream compatibility"). A real HTTP server on
 * loopback; no proxy variables, so the Dialer dials it directly.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Dialer } from '../../src/dial/dialer.js';
import { fetchTarget } from '../../src/upgrade/client.js';
import type { Endpoint } from '../../src/upgrade/endpoint.js';
import { channelVersionSource } from '../../src/upgrade/kube/controller.js';
import { decide } from '../../src/upgrade/kube/decide.js';
import { startHttpServer, type HttpTestServer } from '../helpers/servers.js';

const answers: Record<string, string> = {};
let server: HttpTestServer;

beforeAll(async () => {
  server = await startHttpServer((req, res) => {
    const what = (req.url ?? '').split('/').pop()!;
    res.writeHead(200, { 'content-type': 'text/plain' }).end(answers[what] ?? '');
  });
});
afterAll(() => server.close());

const base = () => `http://127.0.0.1:${server.port}/v1/webapi/automaticupgrades/channel/stable`;
const endpoint = (): Endpoint => ({ host: '127.0.0.1', port: server.port, channel: 'stable', value: '', base: base(), origin: `http://127.0.0.1:${server.port}` });
const env = { dialer: new Dialer({ env: {} }), timeoutMs: 5_000 };

describe('an upstream-style version server', () => {
  it.each([
    ['true', true],
    ['TRUE\n', true],
    ['false', false],
    ['yes', true],
  ])('critical %j is read as %s by both upgraders', async (critical, expected) => {
    answers.version = '17.0.2\n';
    answers.critical = critical;
    expect(await fetchTarget(endpoint(), env)).toMatchObject({ version: '17.0.2', critical: expected });
    expect(await channelVersionSource({ baseUrl: base(), dialer: env.dialer })()).toEqual({ version: 'v17.0.2', critical: expected });
  });

  it('"none" on /version: both take it as no new version (upstream\'s NoNewVersionError), not as a broken server', async () => {
    answers.version = 'none\n';
    answers.critical = 'false';
    expect(await fetchTarget(endpoint(), env)).toEqual({ none: true, url: `${base()}/version` });
    expect(await channelVersionSource({ baseUrl: base(), dialer: env.dialer })()).toEqual({ none: true });
  });

  it('"none" reaches the Kubernetes updater\'s decision as "no new version" (logged as up to date), never an update', () => {
    const workload = { kind: 'Deployment' as const, namespace: 'ns', name: 'agent', annotations: {}, containers: [{ name: 'gateway', image: 'registry.example/gateway:17.0.1' }] };
    const d = decide({ workload, container: 'gateway', target: { none: true }, schedule: { windows: [] }, now: new Date() });
    expect(d).toMatchObject({ action: 'skip', reason: 'no-new-version', current: 'v17.0.1' });
    expect(d.message).toContain('advertises none');
  });
});
