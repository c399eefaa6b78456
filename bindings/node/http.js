'use strict'
// Types only (http.d.ts): nothing to run.
module.exports = {}
