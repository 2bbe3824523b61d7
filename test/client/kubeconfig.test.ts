/**
 * What gwsh kube login writes (src/client/kubeconfig.ts): merged into the kubeconfig without losing anything of
 * it, the file chosen as kubectl chooses it, bad files refused untouched. The merged text is read back by the
 * yaml package and, where it matters, by the real kubectl (test/e2e/kube-upgrades.test.ts).
 */
import { chmodSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { kubeconfigPath, MAX_KUBECONFIG_BYTES, mergeKubeconfig, writeKubeconfig, type KubeLoginEntry } from '../../src/client/kubeconfig.js';
import { codeOfSync } from '../helpers/errors.js';

const dir = mkdtempSync(join(tmpdir(), 'kubeconfig-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const entry = (name = 'gw-dev'): KubeLoginEntry => ({
  name,
  server: 'https://proxy.example.com:443/k8s/dev',
  tls: {
    tlsServerName: 'kube-gateway-proxy-alpn.proxy.example.com',
    caFile: '/home/a/.gwsh/host-ca.pem',
    certFile: '/home/a/.gwsh/cert.pem',
    keyFile: '/home/a/.gwsh/key.pem',
  },
});

type Doc = { 'current-context': string; clusters: Array<{ name: string; cluster: Record<string, string> }>; users: Array<{ name: string; user: Record<string, string> }>; contexts: Array<{ name: string; context: Record<string, string> }> };

const EXISTING = ['# mine', 'apiVersion: v1', 'kind: Config', 'current-context: home', 'clusters:', '- name: home', '  cluster: {server: "https://home:6443"}', 'users:', '- name: me', '  user: {token: abc}', 'contexts:', '- name: home', '  context: {cluster: home, user: me}', 'preferences: {colors: true}', ''].join('\n');

describe('mergeKubeconfig', () => {
  it('a new file: one cluster, user and context, current', () => {
    const doc = parse(mergeKubeconfig(undefined, 'f', entry())) as Doc & { apiVersion: string; kind: string };
    expect(doc).toMatchObject({ apiVersion: 'v1', kind: 'Config', 'current-context': 'gw-dev' });
    expect(doc.clusters).toEqual([{ name: 'gw-dev', cluster: { server: 'https://proxy.example.com:443/k8s/dev', 'tls-server-name': 'kube-gateway-proxy-alpn.proxy.example.com', 'certificate-authority': '/home/a/.gwsh/host-ca.pem' } }]);
    expect(doc.users).toEqual([{ name: 'gw-dev', user: { 'client-certificate': '/home/a/.gwsh/cert.pem', 'client-key': '/home/a/.gwsh/key.pem' } }]);
    expect(doc.contexts).toEqual([{ name: 'gw-dev', context: { cluster: 'gw-dev', user: 'gw-dev' } }]);
  });

  it("gwsh proxy kube's entry: an http:// server on loopback, no TLS settings, a user holding nothing", () => {
    const doc = parse(mergeKubeconfig(undefined, 'f', { name: 'gw-dev-proxy', server: 'http://127.0.0.1:8443/k8s/dev' })) as Doc;
    expect(doc.clusters).toEqual([{ name: 'gw-dev-proxy', cluster: { server: 'http://127.0.0.1:8443/k8s/dev' } }]);
    expect(doc.users).toEqual([{ name: 'gw-dev-proxy', user: {} }]);
    expect(doc['current-context']).toBe('gw-dev-proxy');
  });

  it('an existing file: its entries, settings and comments kept, ours added; a second login replaces ours', () => {
    const once = mergeKubeconfig(EXISTING, 'f', entry());
    expect(once).toContain('# mine');
    const twice = mergeKubeconfig(once, 'f', { ...entry(), server: 'https://other:443/k8s/dev' });
    const doc = parse(twice) as Doc & { preferences: unknown };
    expect(doc.clusters.map((c) => c.name)).toEqual(['home', 'gw-dev']);
    expect(doc.users).toContainEqual({ name: 'me', user: { token: 'abc' } });
    expect(doc.contexts.map((c) => c.name)).toEqual(['home', 'gw-dev']);
    expect(doc.clusters[1]!.cluster.server).toBe('https://other:443/k8s/dev');
    expect(doc.preferences).toEqual({ colors: true });
    expect(doc['current-context']).toBe('gw-dev');
  });

  it('empty lists written as null (kubectl writes "clusters: null") are lists to fill', () => {
    const doc = parse(mergeKubeconfig('apiVersion: v1\nkind: Config\nclusters: null\nusers:\ncontexts: []\n', 'f', entry())) as Doc;
    expect([doc.clusters.length, doc.users.length, doc.contexts.length]).toEqual([1, 1, 1]);
  });

  it('hostile: not YAML (naming the line, never quoting it), not a mapping, a list that is not one, several documents: GW_ERR_CLIENT_KUBECONFIG', () => {
    for (const text of ['users: [\n  token: s3cret-token\n', '- a\n- b\n', 'clusters: {a: 1}\n', 'a: 1\n---\nb: 2\n', 'just a string\n']) {
      expect(codeOfSync(() => mergeKubeconfig(text, 'f', entry())), text).toBe('GW_ERR_CLIENT_KUBECONFIG');
      try {
        mergeKubeconfig(text, 'f', entry());
      } catch (err) {
        expect((err as Error).message).not.toContain('s3cret');
      }
    }
  });
});

describe('writeKubeconfig', () => {
  it('keeps the mode of an existing file, creates a new one 0600, and follows a symbolic link (the link stays)', () => {
    const file = join(dir, 'mode');
    writeFileSync(file, EXISTING);
    chmodSync(file, 0o640);
    writeKubeconfig(file, entry());
    expect(statSync(file).mode & 0o777).toBe(0o640);
    const fresh = join(dir, 'sub', 'fresh');
    writeKubeconfig(fresh, entry());
    expect(statSync(fresh).mode & 0o777).toBe(0o600);
    const link = join(dir, 'link');
    symlinkSync(file, link);
    writeKubeconfig(link, entry('gw-other'));
    expect(readFileSync(file, 'utf8')).toContain('gw-other');
  });

  it('hostile: a file over the cap or not a regular file is refused, untouched', () => {
    const big = join(dir, 'big');
    writeFileSync(big, `# ${'x'.repeat(MAX_KUBECONFIG_BYTES)}\n`);
    expect(codeOfSync(() => writeKubeconfig(big, entry()))).toBe('GW_ERR_CLIENT_KUBECONFIG');
    expect(statSync(big).size).toBe(MAX_KUBECONFIG_BYTES + 3);
    expect(codeOfSync(() => writeKubeconfig(dir, entry()))).toBe('GW_ERR_CLIENT_KUBECONFIG');
  });
});

describe('kubeconfigPath', () => {
  it('--kubeconfig, else the first file of $KUBECONFIG, else ~/.kube/config', () => {
    expect(kubeconfigPath('/x/flag', { KUBECONFIG: '/a:/b' })).toBe('/x/flag');
    expect(kubeconfigPath(undefined, { KUBECONFIG: ':/a:/b' })).toBe('/a');
    expect(kubeconfigPath(undefined, {})).toBe(join(homedir(), '.kube', 'config'));
  });
});
