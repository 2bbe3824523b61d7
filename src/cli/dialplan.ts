/**
 * `gateway dial-plan`: prints the Dialer's decision for each target without dialing, one line (or JSON object)
 * per target, with the reason the decision carries. With --kube-api and --cluster it also prints the decision for
 * the Kubernetes Service's dial of that API server, and both NO_PROXY checks behind it (select.ts, rule 5).
 * Each target also says which IP family its TCP connection uses, where the plan can know it (family.ts).
 * For a dial through a proxy it says which authentication schemes the client can answer a 407 with (auth/scheme.ts).
 */
import { formatHostPort } from '../addr.js';
import { describeProxyAuth } from '../dial/auth/scheme.js';
import { Dialer } from '../dial/dialer.js';
import { familyLabel, familyPlan } from '../dial/family.js';
import { kubeApiAlias, kubeApiTarget, type ProxyDecision } from '../dial/select.js';
import { GatewayError, toGatewayError } from '../errors.js';

export interface DialPlanOptions {
  json?: boolean;
  kubeApi?: string;
  cluster?: string;
}

interface Row {
  /** The target as the user wrote it. */
  label: string;
  decide: () => ProxyDecision;
  extra?: Record<string, unknown>;
}

function rows(targets: readonly string[], opts: DialPlanOptions, dialer: Dialer): Row[] {
  const out: Row[] = targets.map((target) => ({ label: target, decide: () => dialer.plan(target) }));
  if ((opts.kubeApi === undefined) !== (opts.cluster === undefined)) {
    throw new GatewayError('GW_ERR_USAGE', '--kube-api and --cluster go together', {
      hint: "Give the API server (kube_service.clusters[].api_server) and the gateway cluster's name ('gwctl status' prints it): --kube-api https://10.96.0.1:443 --cluster example.com",
    });
  }
  if (opts.kubeApi !== undefined && opts.cluster !== undefined) {
    const { kubeApi, cluster } = opts;
    out.push({ label: kubeApi, decide: () => dialer.plan(kubeApiTarget(kubeApi), kubeApiAlias(cluster)), extra: { kube_cluster: cluster } });
  }
  if (out.length === 0) throw new GatewayError('GW_ERR_USAGE', 'no target given', { hint: 'Give host:port targets or URLs, or --kube-api with --cluster.' });
  return out;
}

/** Prints the plan; returns false when a target could not be decided (bad target or proxy variable). */
export function dialPlan(targets: readonly string[], opts: DialPlanOptions, out: NodeJS.WritableStream = process.stdout): boolean {
  const dialer = new Dialer();
  let ok = true;
  for (const row of rows(targets, opts, dialer)) {
    let decision: ProxyDecision;
    try {
      decision = row.decide();
    } catch (err) {
      ok = false;
      const e = toGatewayError(err);
      if (opts.json) out.write(`${JSON.stringify({ target: row.label, ...row.extra, error: { code: e.code, message: e.message } })}\n`);
      else out.write(`${row.label}: error ${e.code}: ${e.message}\n  hint: ${e.hint}\n`);
      continue;
    }
    const proxy = decision.proxy?.display ?? null;
    const checks = decision.checks?.map((c) => ({ target: c.target, what: c.what, no_proxy_entry: c.entry }));
    const family = familyPlan(decision);
    const auth = decision.proxy ? describeProxyAuth(decision.proxy) : null;
    if (opts.json) {
      const fields = { proxy, source: decision.source, reason: decision.reason, family: { family: family.family, reason: family.reason }, proxy_auth: auth };
      out.write(`${JSON.stringify({ target: row.label, ...row.extra, ...fields, ...(checks ? { checks } : {}) })}\n`);
      continue;
    }
    const how = proxy ? `through ${proxy}` : 'direct';
    const to = formatHostPort(decision.target.host, decision.target.port);
    const what = row.extra?.kube_cluster ? `Kubernetes API server ${row.label} (cluster ${String(row.extra.kube_cluster)})` : row.label;
    out.write(`${what}: ${how} (to ${to}): ${decision.reason}\n`);
    out.write(`  ${familyLabel(family.family)}: ${family.reason}\n`);
    if (auth) out.write(`  proxy authentication: ${auth.reason}\n`);
    for (const c of checks ?? []) {
      out.write(`  NO_PROXY check of ${c.target} (${c.what}): ${c.no_proxy_entry === null ? 'no entry matches' : `exempt by "${c.no_proxy_entry}"`}\n`);
    }
  }
  return ok;
}
