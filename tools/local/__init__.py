"""AWS played on this machine: the workflow definition on moto's interpreter, what Step Functions does that moto does
not, and chaos (AWS's faults and quotas)."""
