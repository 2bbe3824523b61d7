/**
 * The rollout's safety rules on versions, pure (docs/upgrades.md, "Managed rollouts"): an agent never installs a
 * major version above the control plane's (the Auth Service's own), nor more than one major above the version it
 * runs. Creating an autoupdate_version that breaks the first rule, or jumps more than one major from its
 * start_version, is refused (manifests.ts); the planner holds every agent a rule forbids anyway, with the rule as
 * its reason, since agents of any version may join after the resource was written.
 */
import semver from 'semver';
import { GatewayError } from '../../errors.js';

/** The major of a version (17 for 17.0.2, v17.1.0-rc.1); undefined when it is not semver. */
export function majorOf(version: string | undefined): number | undefined {
  if (version === undefined) return undefined;
  const v = semver.parse(version.startsWith('v') ? version.slice(1) : version);
  return v === null ? undefined : v.major;
}

/**
 * Why target must not be installed on an agent running agentVersion under a control plane of controlPlane, as a
 * sentence; undefined when it may. Going down (a rollback) is never held by these rules.
 */
export function versionHold(target: string, agentVersion: string | undefined, controlPlane: string): string | undefined {
  const t = majorOf(target);
  const cp = majorOf(controlPlane);
  if (t === undefined) return `target ${target} is not a version`;
  if (cp !== undefined && t > cp) return `held: target ${target} is a major above the control plane's ${controlPlane} (rule: never above the control plane)`;
  const a = majorOf(agentVersion);
  if (a !== undefined && t > a + 1) return `held: target ${target} is more than one major above the agent's ${agentVersion} (rule: one major at a time)`;
  return undefined;
}

/** Refuses (GW_ERR_AUTOUPDATE_MAJOR) an autoupdate_version whose target breaks a rule against its own start. */
export function checkVersionResource(start: string, target: string, controlPlane: string): void {
  const t = majorOf(target);
  const cp = majorOf(controlPlane);
  const s = majorOf(start);
  if (t !== undefined && cp !== undefined && t > cp) {
    throw new GatewayError('GW_ERR_AUTOUPDATE_MAJOR', `target_version ${target} is a major version above the control plane's ${controlPlane}: agents never run it`, {
      hint: `Upgrade the Auth Service and the Proxies to ${t}.x first, then set this target.`,
      details: { rule: 'control-plane' },
    });
  }
  if (t !== undefined && s !== undefined && t > s + 1) {
    throw new GatewayError('GW_ERR_AUTOUPDATE_MAJOR', `target_version ${target} is more than one major version above start_version ${start}`, {
      hint: `Roll agents out to ${s + 1}.x first, then to ${target}.`,
      details: { rule: 'one-major' },
    });
  }
}
