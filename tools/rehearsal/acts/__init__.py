"""The rehearsal story's acts: each plays one part of the user's story on the deployed stack and tells the report
what happened."""
