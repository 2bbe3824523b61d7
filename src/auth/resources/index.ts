/** Resources managed with gwctl: types, manifest parsing and output, connector role mappings. See docs/resources.md. */
export * from './types.js';
export { parseManifest, parseManifestFiles, toYaml, toJson, withoutSecrets, tokenId, type ManifestProblem } from './manifest.js';
export { durationMs } from './schema.js';
export { matchValue, isRegexPattern, expandTemplates } from './match.js';
export { githubRoles, samlRoles, oidcRoles } from './connectors.js';
export * from './plan.js';
export { unifiedDiff } from './diff.js';
