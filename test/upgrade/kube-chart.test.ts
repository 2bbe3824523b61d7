/**
 * The Helm chart deploy/gateway-kube-agent, checked as text (kube-chart-render.test.ts renders it with the real
 * Helm and checks the objects). Here: Chart.yaml and
 * values.yaml parse and carry the values the seed lists with their defaults; every `.Values.x` a template reads
 * exists in values.yaml; template actions and blocks are balanced; versionServer is read by NOTES.txt only (a
 * warning) and by no manifest; the updater's arguments are flags gateway-kube-updater really has; its Role allows
 * exactly the API calls of src/upgrade/kube/client.ts.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import semver from 'semver';
import { spawnSync } from 'node:child_process';

const CHART = fileURLToPath(new URL('../../deploy/gateway-kube-agent/', import.meta.url));
const read = (p: string) => readFileSync(join(CHART, p), 'utf8');
const TEMPLATES = readdirSync(join(CHART, 'templates')).sort();
const template = (name: string) => read(join('templates', name));
const values = parse(read('values.yaml')) as Record<string, unknown>;

function get(obj: unknown, path: string[]): unknown {
  return path.reduce<unknown>((o, k) => (o !== null && typeof o === 'object' && k in (o as object) ? (o as Record<string, unknown>)[k] : undefined), obj);
}

describe('Chart.yaml and values.yaml', () => {
  it('the chart is gateway-kube-agent, Helm 3 (apiVersion v2), with a semver version', () => {
    const chart = parse(read('Chart.yaml')) as { apiVersion: string; name: string; version: string; appVersion: string };
    expect(chart).toMatchObject({ apiVersion: 'v2', name: 'gateway-kube-agent' });
    expect(semver.valid(chart.version)).not.toBeNull();
    expect(chart.appVersion).toBe(JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')).version);
  });

  it("carries the seed's values with their defaults", () => {
    expect(get(values, ['updater', 'enabled'])).toBe(false);
    expect(get(values, ['updater', 'releaseChannel'])).toBe('default');
    expect(get(values, ['annotations', 'deployment'])).toEqual({});
    expect(values).toHaveProperty('versionServer', '');
    expect(read('values.yaml')).toMatch(/Obsolete since v13\.4\.15, v14\.3\.1 and v15[^\n]*\n[^\n]*Ignored/);
  });
});

describe('templates', () => {
  it('every .Values path a template reads exists in values.yaml', () => {
    const missing: string[] = [];
    for (const name of TEMPLATES) {
      for (const m of template(name).matchAll(/\.Values\.([A-Za-z0-9_.]+)/g)) {
        const path = m[1]!.replace(/\.$/, '').split('.');
        if (get(values, path) === undefined) missing.push(`${name}: .Values.${path.join('.')}`);
      }
    }
    expect(missing).toEqual([]);
  });

  it('actions and blocks are balanced in every template', () => {
    for (const name of TEMPLATES) {
      const text = template(name);
      expect((text.match(/\{\{/g) ?? []).length, name).toBe((text.match(/\}\}/g) ?? []).length);
      const opens = [...text.matchAll(/\{\{-?\s*(if|with|range|define)\b/g)].length;
      const ends = [...text.matchAll(/\{\{-?\s*end\s*-?\}\}/g)].length;
      expect(ends, name).toBe(opens);
    }
  });

  it('versionServer is ignored: only NOTES.txt reads it, to warn that it is obsolete', () => {
    for (const name of TEMPLATES.filter((t) => t !== 'NOTES.txt')) expect(template(name), name).not.toContain('versionServer');
    const notes = template('NOTES.txt');
    expect(notes).toMatch(/\{\{- if \.Values\.versionServer \}\}\s*\n\s*\nWARNING: versionServer is obsolete since v13\.4\.15, v14\.3\.1 and v15, and is ignored\./);
  });

  it('annotations.deployment goes on the agent StatefulSet / Deployment itself', () => {
    const agent = template('agent.yaml');
    expect(agent).toMatch(/kind: \{\{ \.Values\.agentKind \}\}\nmetadata:[\s\S]*\{\{- with \.Values\.annotations\.deployment \}\}\n  annotations:\n    \{\{- toYaml \. \| nindent 4 \}\}/);
    expect(agent.indexOf('annotations.deployment')).toBeLessThan(agent.indexOf('spec:'));
  });

  it('the updater exists only with updater.enabled, and follows updater.releaseChannel', () => {
    const updater = template('updater.yaml');
    expect(updater.trimStart().startsWith('{{- if .Values.updater.enabled }}')).toBe(true);
    expect(updater.trimEnd().endsWith('{{- end }}')).toBe(true);
    expect(updater).toContain('- --channel={{ .Values.updater.releaseChannel | default "default" }}');
    expect(updater).toContain('command: [gateway-kube-updater]');
  });

  it("the updater's arguments are flags that gateway-kube-updater has", () => {
    const bin = fileURLToPath(new URL('../../dist/cli/gateway-kube-updater.js', import.meta.url));
    const help = spawnSync(process.execPath, [bin, '--help'], { encoding: 'utf8' }).stdout;
    const flags = [...template('updater.yaml').matchAll(/^\s*- (--[a-z-]+)/gm)].map((m) => m[1]!);
    expect(flags).toEqual(expect.arrayContaining(['--agent-name', '--agent-kind', '--container', '--proxy-addr', '--channel', '--schedule-secret']));
    for (const flag of flags) expect(help, flag).toContain(flag);
  });

  it("the updater's Role allows exactly what its client calls: get/list/watch/patch on the agent, get on the schedule Secret", () => {
    const docs = template('updater.yaml')
      .split(/^---$/m)
      .map((d) => d.replace(/^\s*\{\{[^}]*\}\}\s*$/gm, '').replace(/\{\{[^}]*\}\}/g, 'X'))
      .map((d) => parse(d) as { kind?: string; rules?: Array<{ apiGroups: string[]; resources: string[]; verbs: string[]; resourceNames?: string[] }> } | null);
    const role = docs.find((d) => d?.kind === 'Role')!;
    const allowed = (group: string, resource: string, verb: string) => role.rules!.some((r) => r.apiGroups.includes(group) && r.resources.includes(resource) && r.verbs.includes(verb));
    for (const resource of ['statefulsets', 'deployments']) for (const verb of ['get', 'list', 'watch', 'patch']) expect(allowed('apps', resource, verb), `${verb} ${resource}`).toBe(true);
    expect(allowed('', 'secrets', 'get')).toBe(true);
    expect(allowed('', 'secrets', 'list')).toBe(false);
    expect(allowed('', 'secrets', 'patch')).toBe(false);
    expect(role.rules!.flatMap((r) => r.verbs)).not.toContain('delete');
  });
});
